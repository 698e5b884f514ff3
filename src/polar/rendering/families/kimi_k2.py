"""Kimi K2.5 / K2.6: special-token call sections whose ids (``functions.NAME:IDX``) are the
model's own and name each result in history (``## Return of <id>``), so they are kept.

Turns end with ``<|im_end|>`` (eos is ``[EOS]``). The template keeps reasoning only after the
last plain answer (earlier turns get ``<think></think>``), hence ``reasoning_history: drop``.

K2.5/K2.6 templates declare tools from ``tools_ts_str`` when given: Kimi's tokenizer code (which
vLLM and SGLang load) sorts the tools' keys and passes TypeScript-style declarations
(:mod:`kimi_tools_ts`), so the family does too; the template's JSON fallback is only what a
schema the encoder cannot express gets, as with the tokenizer.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from polar.rendering.families.base import Family, Features, has_special, template_has
from polar.rendering.families.kimi_tools_ts import deep_sorted, typescript_declarations

_SECTION = (
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)


class KimiK2Family(Family):
    name = "kimi_k2"
    tool_parser = "kimi_k2"
    turn_ends = ("<|im_end|>",)
    parse_specials = (*_SECTION, "<think>", "</think>")
    reasoning_history = "drop"
    features = Features(reasoning=True, images=True)
    model_call_ids = True

    def matches(self, tokenizer: Any) -> bool:
        return has_special(tokenizer, "<|im_middle|>", *_SECTION[:2]) and template_has(
            tokenizer, "tool_calls_section_begin"
        )

    def template_inputs(
        self, tools: list[dict[str, Any]] | None, template: str | None
    ) -> tuple[list[dict[str, Any]] | None, dict[str, Any]]:
        """Key-sorted tools and their TypeScript declarations where the template reads them."""
        if not tools or template is None or "tools_ts_str" not in template:
            return tools, {}
        tools = deep_sorted(tools)
        # A schema the encoder refuses: the JSON fallback, as with Kimi's tokenizer.
        with suppress(ValueError, TypeError, KeyError, AttributeError):
            return tools, {"tools_ts_str": typescript_declarations(tools)}
        return tools, {}
