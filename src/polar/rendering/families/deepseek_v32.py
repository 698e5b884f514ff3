# ruff: noqa: RUF002  (DeepSeek's tokens are spelled with fullwidth bars)
"""DeepSeek V3.2: rendered by its official Python encoder, not a Jinja template.

DeepSeek publishes no chat template for V3.2, only ``encoding_dsv32.py``; vLLM and SGLang render
with it, and the community Jinja differs from it. Polar uses the copy SGLang vendors, as shipped
in ``miles-tito-tokenizers`` (the ``deepseek`` extra): without it this family refuses to start.
Calls are DSML blocks, results ``<function_results>`` after the call turn; every turn, call or
answer, ends with ``<｜end▁of▁sentence｜>``. ``deepseek_v32`` renders in chat mode (the engines'
default: no reasoning sampled, nothing for history to drop); ``deepseek_v32_thinking`` in
thinking mode, where the encoder drops reasoning before the latest user message
(``reasoning_history: drop``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from polar.errors import InvalidRequest
from polar.extras import require
from polar.rendering.call_patterns import OPEN_TEXT
from polar.rendering.chat_template import validate_messages
from polar.rendering.families.base import Family, Features, has_special, template_has
from polar.rendering.tool_text import flatten_content

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"


def _encoder() -> Any:
    require("deepseek", "rendering DeepSeek V3.2 with its official encoder (or set render: engine)")
    from miles_tito_tokenizers.encoders import deepseek_v32

    return deepseek_v32


class DeepSeekV32Family(Family):
    name = "deepseek_v32"
    tool_parser = "deepseek_v32"
    turn_ends = (EOS,)
    parse_specials = ("<think>", "</think>")
    # Chat mode: the prompt closes the thought (</think>), the model samples none, so there is
    # no reasoning for history to drop and every turn can be spliced.
    features = Features(reasoning=False)
    thinking_mode: ClassVar[str] = "chat"

    def matches(self, tokenizer: Any) -> bool:
        if not has_special(tokenizer, BOS, EOS):
            return False
        if template_has(tokenizer, "｜DSML｜function_calls"):
            return True
        return not getattr(tokenizer, "chat_template", None) and _model_type(tokenizer) == (
            "deepseek_v32"
        )

    def chat_template(self, tokenizer: Any) -> str | None:
        _encoder()  # refuse at start, not at the first request, when the encoder is missing
        return None

    def render(
        self,
        tokenizer: Any,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        chat_template: str | None,
        add_generation_prompt: bool = True,
        continue_final: bool = False,
        started: datetime | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The encoder's prompt: it always ends a user or tool turn by opening the assistant's
        (it prints no date, so ``started`` changes nothing; it reads no template variables,
        so ``variables`` is always empty: :meth:`reasoning_variables` finds none)."""
        if continue_final:
            raise InvalidRequest("DeepSeek V3.2's encoder cannot continue an assistant message")
        validate_messages(messages)
        encoder = _encoder()
        try:
            return str(
                encoder.render_messages(
                    [_for_encoder(m) for m in messages],
                    tools=tools or None,
                    thinking_mode=self.thinking_mode,
                )
            )
        except encoder.DS32EncodingError as exc:
            raise InvalidRequest(f"DeepSeek V3.2's encoder rejected these messages: {exc}") from exc


class DeepSeekV32ThinkingFamily(DeepSeekV32Family):
    """DeepSeek V3.2 in thinking mode (by name only: the tokenizer cannot tell the mode)."""

    name = "deepseek_v32_thinking"
    thinking_mode = "thinking"
    reasoning_history = "drop"
    features = Features(reasoning=True)

    def matches(self, tokenizer: Any) -> bool:
        return False

    def call_pattern(self, functions: list[dict[str, Any]], parallel: bool) -> str | None:
        """The calls after the thought the prompt's ``<think>`` opened."""
        calls = super().call_pattern(functions, parallel)
        return None if calls is None else f"({OPEN_TEXT}</think>)?{calls}"


def _for_encoder(message: dict[str, Any]) -> dict[str, Any]:
    """vLLM's preprocessing, less what the encoder wants otherwise: text content, reasoning
    as ``reasoning_content``, call arguments as JSON text (it parses them itself)."""
    out = dict(message)
    out["content"] = flatten_content(message.get("content"))
    if "reasoning" in out and "reasoning_content" not in out:
        out["reasoning_content"] = out.pop("reasoning")
    if message.get("tool_calls"):
        out["tool_calls"] = [_with_text_arguments(c) for c in message["tool_calls"]]
    return out


def _with_text_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        function["arguments"] = json.dumps(arguments or {}, ensure_ascii=False)
    elif not arguments:
        function["arguments"] = "{}"
    return {**call, "function": function}


def _model_type(tokenizer: Any) -> str:
    """``model_type`` from the checkpoint's config.json next to the tokenizer, if any."""
    config = Path(str(getattr(tokenizer, "name_or_path", "") or "")) / "config.json"
    try:
        value = json.loads(config.read_text("utf-8")).get("model_type", "")
    except (OSError, ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""
