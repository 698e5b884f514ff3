"""Kimi K2.5 / K2.6: special-token call sections whose ids (``functions.NAME:IDX``) are the
model's own and name each result in history (``## Return of <id>``), so they are kept.

Turns end with ``<|im_end|>`` (eos is ``[EOS]``). The template keeps reasoning only after the
last plain answer (earlier turns get ``<think></think>``), hence ``reasoning_history: drop``.
"""

from __future__ import annotations

from typing import Any

from polar.rendering.families.base import Family, Features, has_special, template_has

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
