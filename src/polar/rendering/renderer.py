"""The gateway's own rendering: a request to prompt ids, sampled ids back to a reply.

:meth:`Renderer.plan` builds each prompt so that it extends an earlier call of the session
exactly: when the request's history ends in an assistant turn this session sampled, and all
before it is what that call was given, the prompt is that call's prompt ids + its sampled ids +
the template's rendering of what the harness added since (tool results, user text, the
generation prompt). Nothing of the sampled turn is re-rendered, so JSON whitespace, key order,
non-canonical tokenizations and templates that drop past reasoning cannot change it. A request
that does not continue a known turn is rendered whole, and the plan says why.

Everything family-specific (template, parser, turn-end tokens, what history writes in their
place, the reasoning-history policy) comes from the served model's
:class:`~polar.rendering.families.base.Family`.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from polar.errors import ConfigError, InvalidRequest
from polar.providers.types import NormalizedRequest
from polar.rendering.families.base import Family, ReasoningHistory
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
FRESH_REASONING_DROPPED = "reasoning_history_drop"


@dataclass(frozen=True)
class _Render:
    """What every render of one plan shares: the session's start (the date a template prints)
    and the request's template variables."""

    started: datetime
    variables: Mapping[str, Any]


@dataclass(frozen=True)
class PromptPlan:
    """The prompt ids to send, and how they were made."""

    ids: list[int]
    digest: bytes
    spliced_from: str | None = None
    fresh_reason: str | None = None
    base: SampledTurn | None = None  # the turn it extends
    shared: int = 0  # leading ids that are the base's prompt + sampled ids
    # The splice carries a sampled turn's reasoning past a new user query, where the template
    # would have dropped it (reasoning_history: keep).
    keeps_dropped_reasoning: bool = False
    # The request's own template variables it was rendered with (the reasoning switch and
    # effort), on the record beside the messages so a render can be repeated exactly.
    template_variables: dict[str, Any] = field(default_factory=dict)


class Renderer:
    """A served model's tokenizer and family (template, parser, turn ends), used by the gateway.

    ``chat_template``, ``parser``, ``turn_ends`` and ``reasoning_history`` override the
    family's own (the ``render`` config section).
    """

    def __init__(
        self,
        tokenizer: Any,
        family: Family,
        *,
        chat_template: str | None = None,
        parser: ToolParser | None = None,
        turn_ends: tuple[str, ...] | None = None,
        reasoning_history: ReasoningHistory | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.family = family
        self.parser = parser or family.parser()
        self.chat_template = chat_template or family.chat_template(tokenizer)
        self.reasoning_history: ReasoningHistory = reasoning_history or family.reasoning_history
        self.turn_ends: dict[int, str] = {}
        for token in turn_ends or family.turn_end_tokens(tokenizer):
            token_id = tokenizer.convert_tokens_to_ids(token)
            if not isinstance(token_id, int) or token_id == tokenizer.unk_token_id:
                raise ConfigError(
                    f"the tokenizer has no end-of-turn token {token!r} (family "
                    f"{family.name}); set render.eot_token"
                )
            self.turn_ends[token_id] = token
        if not self.turn_ends:
            raise ConfigError("the tokenizer has no eos token; set render.eot_token")
        self.eot_id: int = next(iter(self.turn_ends))  # the first: what a turn usually ends with
        self._special = _special_tokens(tokenizer)
        # Fast tokenizers are not safe to call from several threads at once.
        self._lock = threading.Lock()

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        continue_final: bool = False,
        started: datetime | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text; ``started``: the session's start, the date a template prints;
        ``variables``: the request's template variables (its reasoning switch and effort)."""
        return self.family.render(
            self.tokenizer,
            messages,
            tools or None,
            chat_template=self.chat_template,
            continue_final=continue_final,
            started=started,
            variables=variables,
        )

    def reasoning_variables(self) -> tuple[str | None, str | None]:
        """The reasoning switch and effort variables the chat template reads (None: none)."""
        return self.family.reasoning_variables(self.chat_template)

    def encode(self, text: str) -> list[int]:
        with self._lock:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``, special tokens included (what the model really sampled)."""
        with self._lock:
            return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def sampled_text(self, ids: list[int]) -> str:
        """A sampled turn's text for the parser: special tokens the family's parser reads stay,
        every other special token (eos, padding) is dropped."""
        pieces: list[str] = []
        run: list[int] = []
        for token_id in ids:
            special = self._special.get(token_id)
            if special is None:
                run.append(token_id)
                continue
            pieces.append(self.decode(run))
            run = []
            if special in self.family.parse_specials:
                pieces.append(special)
        pieces.append(self.decode(run))
        return "".join(pieces)

    def plan(
        self,
        book: TurnBook,
        request: NormalizedRequest,
        variables: Mapping[str, Any] | None = None,
    ) -> PromptPlan:
        """The prompt for ``request``: an exact extension of a sampled turn where possible;
        ``variables`` (the request's template variables) reach every render of it."""
        messages, tools = request.messages, request.tools
        at = _Render(book.started, variables or {})
        digest = context_digest(messages, tools)
        if request.continue_final:
            # A prefill is new text inside an open assistant turn: rendered whole, left open.
            text = self.render(
                messages, tools, continue_final=True, started=at.started, variables=at.variables
            )
            return PromptPlan(self.encode(text), digest, fresh_reason=FRESH_PREFILL)
        last = _last_assistant(messages)
        if last is None:
            return self._whole(messages, tools, digest, FRESH_NO_ASSISTANT_TURN, at)
        before = context_digest(messages[:last], tools)
        turn = book.find(messages[last], before)
        if turn is None:
            return self._whole(messages, tools, digest, FRESH_UNKNOWN_TURN, at)
        if before != turn.context_digest:
            return self._whole(messages, tools, digest, FRESH_HISTORY_CHANGED, at)
        new_query = self.family.features.reasoning and _has_user_turn(messages[last + 1 :])
        if new_query and self.reasoning_history == "drop":
            return self._whole(messages, tools, digest, FRESH_REASONING_DROPPED, at)
        tail = self._after_turn(messages, last, tools, turn, at)
        if tail is None:
            return self._whole(messages, tools, digest, FRESH_TEMPLATE_GLUE, at)
        head = [*turn.prompt_ids, *turn.sampled_ids]
        return PromptPlan(
            head + self.encode(tail),
            digest,
            spliced_from=turn.completion_id,
            base=turn,
            shared=len(head),
            keeps_dropped_reasoning=new_query,
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
            turn_end=self.turn_ends.get(sampled_ids[-1]) if sampled_ids else None,
            base=base,
        )
        book.add(turn, content, tool_call_ids, bool(tool_call_ids))

    def parse(
        self, sampled_ids: list[int], request: NormalizedRequest
    ) -> tuple[ParsedTurn, str | None]:
        """Content, reasoning and tool calls of a sampled turn, and the stop string it hit."""
        ended = bool(sampled_ids) and sampled_ids[-1] in self.turn_ends
        body = sampled_ids[:-1] if ended else sampled_ids
        text, stop = cut_at_stop(self.sampled_text(body), tuple(request.params.stop or ()))
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
        at: _Render,
    ) -> PromptPlan:
        text = self.render(messages, tools, started=at.started, variables=at.variables)
        return PromptPlan(self.encode(text), digest, fresh_reason=reason)

    def _after_turn(
        self,
        messages: list[dict[str, Any]],
        index: int,
        tools: list[dict[str, Any]],
        turn: SampledTurn,
        at: _Render,
    ) -> str | None:
        """The template's text after the assistant turn at ``index``, minus what the sampled
        ids already hold (their turn-end token), or None if it cannot be told apart.

        The turn is rendered as a placeholder that keeps its tool calls (and ids), since
        templates check them to render the tool results after it. The rendered calls and the
        template's own close are cut: up to what history writes for the sampled turn end, or,
        for a turn cut by length or a stop string, up to the first close of any kind.
        """
        marked = {
            k: v for k, v in messages[index].items() if k not in ("reasoning", "reasoning_content")
        }
        marked["content"] = _PLACEHOLDER
        history = [*messages[:index], marked, *messages[index + 1 :]]
        try:
            text = self.render(history, tools, started=at.started, variables=at.variables)
        except InvalidRequest:
            return None  # the template refuses the history: rendered whole, its error shown
        start = self._turn_start(text, messages[:index], tools, at)
        if start is None:
            return None
        if turn.turn_end is None:
            close_at, close = self._first_close(text, start)
            # A length or stop-string end: the template's own close is the tail's start.
            return None if close is None else text[close_at:]
        close = self.family.history_end(turn.turn_end)
        close_at = text.find(close, start)
        if close_at < 0 or self._other_close(text, start, close_at, close):
            return None
        return text[close_at + len(close) :]

    def _turn_start(
        self,
        text: str,
        before: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        at: _Render,
    ) -> int | None:
        """Where the placeholder turn's own text starts in ``text``: after the placeholder,
        or, for a template that drops a call turn's text (Llama 3.1), after the history
        before it rendered alone, when that is a prefix."""
        if text.count(_PLACEHOLDER) == 1:
            return text.index(_PLACEHOLDER) + len(_PLACEHOLDER)
        if _PLACEHOLDER in text or not before:
            return None
        try:
            prefix = self.family.render(
                self.tokenizer,
                before,
                tools or None,
                chat_template=self.chat_template,
                add_generation_prompt=False,
                started=at.started,
                variables=at.variables,
            )
        except InvalidRequest:
            return None
        return len(prefix) if text.startswith(prefix) else None

    def _closes(self) -> set[str]:
        return {self.family.history_end(t) for t in self.turn_ends.values()} - {""}

    def _first_close(self, text: str, start: int) -> tuple[int, str | None]:
        """The earliest text history writes to close a turn, at or after ``start``."""
        best: tuple[int, str | None] = (len(text), None)
        for close in self._closes():
            at = text.find(close, start)
            if 0 <= at < best[0]:
                best = (at, close)
        return best

    def _other_close(self, text: str, start: int, end: int, close: str) -> bool:
        """Whether another turn's close comes first: the turn ended with a token that does not
        fit what follows it (GLM's <|user|> before a tool result), so the tail is unknown."""
        others = self._closes() - {close} - set(self.family.inner_closes)
        return any(text.find(other, start, end) >= 0 for other in others)


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """``text`` up to the earliest stop string (excluded, as vLLM does), and that string."""
    hits = [(text.find(s), s) for s in stops if s and s in text]
    if not hits:
        return text, None
    position, stop = min(hits)
    return text[:position], stop


def _has_user_turn(messages: list[dict[str, Any]]) -> bool:
    return any(m.get("role") == "user" for m in messages)


def _special_tokens(tokenizer: Any) -> dict[int, str]:
    """Every special token of ``tokenizer`` by id (added tokens marked special included)."""
    found = {
        token_id: str(token.content)
        for token_id, token in getattr(tokenizer, "added_tokens_decoder", {}).items()
        if getattr(token, "special", False)
    }
    for token_id, token in zip(
        tokenizer.all_special_ids, tokenizer.all_special_tokens, strict=False
    ):
        found.setdefault(int(token_id), str(token))
    return found


def _last_assistant(messages: list[dict[str, Any]]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            return index
    return None
