"""The gateway's own rendering: a request to prompt ids, sampled ids back to a reply.

:meth:`Renderer.plan` builds each prompt so that it extends an earlier call of the session
exactly: when the request's history ends in an assistant turn this session sampled, and all
before it is what that call was given, the prompt is that call's prompt ids + its sampled ids +
the template's rendering of what the harness added since (tool results, user text, the
generation prompt). Nothing of the sampled turn is re-rendered, so JSON whitespace, key order,
non-canonical tokenizations and templates that drop past reasoning cannot change it. A request
that does not continue a known turn is rendered whole, and the plan says why.
"""

from __future__ import annotations

import threading
from array import array
from dataclasses import dataclass
from typing import Any

from polar.errors import ConfigError
from polar.providers.types import NormalizedRequest
from polar.rendering.chat_template import render_text
from polar.rendering.parsers.base import ParsedTurn, ToolParser
from polar.rendering.turns import SampledTurn, TurnBook, context_digest

# Stands in for the sampled turn while the template renders what follows it.
_PLACEHOLDER = "\ue000polar-sampled-turn\ue000"

# Why a prompt was rendered whole instead of extending a sampled turn.
FRESH_NO_ASSISTANT_TURN = "no_assistant_turn"
FRESH_UNKNOWN_TURN = "unknown_assistant_turn"
FRESH_HISTORY_CHANGED = "history_changed"
FRESH_TEMPLATE_GLUE = "template_glue_unknown"
FRESH_PREFILL = "assistant_prefill"


@dataclass(frozen=True)
class PromptPlan:
    """The prompt ids to send, and how they were made."""

    ids: list[int]
    digest: bytes
    spliced_from: str | None = None
    fresh_reason: str | None = None
    base: SampledTurn | None = None  # the turn it extends
    shared: int = 0  # leading ids that are the base's prompt + sampled ids


class Renderer:
    """A served model's tokenizer, chat template and tool-call parser, used by the gateway."""

    def __init__(
        self,
        tokenizer: Any,
        parser: ToolParser,
        *,
        chat_template: str | None = None,
        eot_token: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.parser = parser
        self.chat_template = chat_template
        self.eot_text = str(eot_token or tokenizer.eos_token or "")
        eot_id = tokenizer.convert_tokens_to_ids(self.eot_text) if self.eot_text else None
        if not isinstance(eot_id, int) or eot_id == tokenizer.unk_token_id:
            raise ConfigError(
                f"the tokenizer has no end-of-turn token {self.eot_text!r}; set render.eot_token"
            )
        self.eot_id: int = eot_id
        # Fast tokenizers are not safe to call from several threads at once.
        self._lock = threading.Lock()

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        continue_final: bool = False,
    ) -> str:
        return render_text(
            self.tokenizer,
            messages,
            tools or None,
            add_generation_prompt=True,
            chat_template=self.chat_template,
            continue_final=continue_final,
        )

    def encode(self, text: str) -> list[int]:
        with self._lock:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        with self._lock:
            return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def count(self, request: NormalizedRequest) -> int:
        """The prompt length of ``request`` rendered whole (token counting endpoints)."""
        text = self.render(request.messages, request.tools, continue_final=request.continue_final)
        return len(self.encode(text))

    def plan(self, book: TurnBook, request: NormalizedRequest) -> PromptPlan:
        """The prompt for ``request``: an exact extension of a sampled turn where possible."""
        messages, tools = request.messages, request.tools
        digest = context_digest(messages, tools)
        if request.continue_final:
            # A prefill is new text inside an open assistant turn: rendered whole, left open.
            text = self.render(messages, tools, continue_final=True)
            return PromptPlan(self.encode(text), digest, fresh_reason=FRESH_PREFILL)
        last = _last_assistant(messages)
        if last is None:
            return self._whole(messages, tools, digest, FRESH_NO_ASSISTANT_TURN)
        turn = book.find(messages[last])
        if turn is None:
            return self._whole(messages, tools, digest, FRESH_UNKNOWN_TURN)
        if context_digest(messages[:last], tools) != turn.context_digest:
            return self._whole(messages, tools, digest, FRESH_HISTORY_CHANGED)
        tail = self._after_turn(messages, last, tools, turn)
        if tail is None:
            return self._whole(messages, tools, digest, FRESH_TEMPLATE_GLUE)
        head = [*turn.prompt_ids, *turn.sampled_ids]
        return PromptPlan(
            head + self.encode(tail),
            digest,
            spliced_from=turn.completion_id,
            base=turn,
            shared=len(head),
        )

    def remember(
        self,
        book: TurnBook,
        plan: PromptPlan,
        completion_id: str,
        prompt_ids: list[int],
        sampled_ids: list[int],
        content: str,
        tool_call_ids: list[str],
    ) -> None:
        """Enter a finished call so later requests that continue it can extend it exactly.

        ``prompt_ids`` are what the engine reports it conditioned on (``plan.ids`` unless it
        said otherwise); the turn shares its base only where they agree with the plan.
        """
        base, own = None, prompt_ids
        if plan.base is not None and prompt_ids[: plan.shared] == plan.ids[: plan.shared]:
            base, own = plan.base, prompt_ids[plan.shared :]
        turn = SampledTurn(
            completion_id=completion_id,
            own_ids=array("i", own),
            sampled_ids=array("i", sampled_ids),
            context_digest=plan.digest,
            ended_with_eot=bool(sampled_ids) and sampled_ids[-1] == self.eot_id,
            base=base,
        )
        book.add(turn, content, tool_call_ids, bool(tool_call_ids))

    def parse(
        self, sampled_ids: list[int], request: NormalizedRequest
    ) -> tuple[ParsedTurn, str | None]:
        """Content, reasoning and tool calls of a sampled turn, and the stop string it hit."""
        body = sampled_ids[:-1] if sampled_ids and sampled_ids[-1] == self.eot_id else sampled_ids
        text, stop = cut_at_stop(self.decode(body), tuple(request.params.stop or ()))
        tools_allowed = bool(request.tools) and request.tool_choice != "none"
        parsed = self.parser.parse(text, request.tools if tools_allowed else None)
        if parsed.tool_calls and not tools_allowed:
            parsed = ParsedTurn(content=text, reasoning=None, tool_calls=[])
        return parsed, stop

    def _whole(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        digest: bytes,
        reason: str,
    ) -> PromptPlan:
        return PromptPlan(self.encode(self.render(messages, tools)), digest, fresh_reason=reason)

    def _after_turn(
        self,
        messages: list[dict[str, Any]],
        index: int,
        tools: list[dict[str, Any]],
        turn: SampledTurn,
    ) -> str | None:
        """The template's text after the assistant turn at ``index``, minus what the sampled
        ids already hold (their end-of-turn token), or None if the template hides the turn."""
        marked = [*messages[:index], {"role": "assistant", "content": _PLACEHOLDER}]
        marked += messages[index + 1 :]
        text = self.render(marked, tools)
        at = text.find(_PLACEHOLDER)
        if at < 0 or text.count(_PLACEHOLDER) != 1:
            return None
        tail = text[at + len(_PLACEHOLDER) :]
        if not turn.ended_with_eot:
            return tail  # a length or stop-string end: the template closes the turn
        if not tail.startswith(self.eot_text):
            return None
        return tail[len(self.eot_text) :]


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """``text`` up to the earliest stop string (excluded, as vLLM does), and that string."""
    hits = [(text.find(s), s) for s in stops if s and s in text]
    if not hits:
        return text, None
    position, stop = min(hits)
    return text[:position], stop


def _last_assistant(messages: list[dict[str, Any]]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            return index
    return None
