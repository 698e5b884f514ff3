"""gpt-oss: harmony messages on channels, every piece of markup a special token.

The model ends a call turn with ``<|call|>`` and an answer with ``<|return|>``; history writes
the call back with ``<|call|>`` and closes a past answer with ``<|end|>``. Its template reads
past reasoning from ``thinking`` (vLLM's harmony path takes ``reasoning_content``), renders one
call per assistant message (so no parallel calls), has no place for a preamble beside the
thought of a call turn (the preamble is left out of a whole render) and keeps reasoning only on
call turns not yet followed by an answer, hence ``reasoning_history: drop``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from polar.rendering.families.base import Family, Features, has_special

_MARKUP = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>")


class GptOssFamily(Family):
    name = "gpt_oss"
    tool_parser = "openai"
    turn_ends = ("<|return|>", "<|call|>")
    history_ends = {"<|return|>": "<|end|>"}
    # A call turn's analysis message closes with <|end|> before the call's own <|call|>.
    inner_closes = ("<|end|>",)
    parse_specials = (*_MARKUP, "<|call|>", "<|return|>")
    reasoning_history = "drop"
    features = Features(parallel_tool_calls=False, reasoning=True)

    def matches(self, tokenizer: Any) -> bool:
        return has_special(tokenizer, "<|channel|>", "<|message|>", "<|call|>", "<|return|>")

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
        """The template after moving each assistant turn's reasoning to ``thinking``, where the
        template reads it, and dropping empty ``tool_calls`` (it tests the key, not its value)."""
        return super().render(
            tokenizer,
            [_for_harmony_template(m) for m in messages],
            tools,
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            continue_final=continue_final,
            started=started,
            variables=variables,
        )


def _for_harmony_template(message: dict[str, Any]) -> dict[str, Any]:
    if message.get("role") != "assistant":
        return message
    out = {k: v for k, v in message.items() if k not in ("reasoning", "reasoning_content")}
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        out["thinking"] = reasoning
    if not out.get("tool_calls"):
        out.pop("tool_calls", None)
    elif reasoning and out.get("content"):
        # The template renders a call turn's text AS its analysis message and refuses both
        # (harmony itself would write the thought, then the preamble on commentary): the
        # thought is what the model reasoned with, so it stays and the preamble goes.
        out["content"] = ""
    return out
