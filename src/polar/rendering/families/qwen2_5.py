"""Qwen2.5-Instruct: ChatML, ``<tool_call>`` JSON calls, no reasoning."""

from __future__ import annotations

from typing import Any

from polar.rendering.families.base import Family, has_special, template_has


class Qwen25Family(Family):
    name = "qwen2_5"
    tool_parser = "hermes"
    turn_ends = ("<|im_end|>",)

    def matches(self, tokenizer: Any) -> bool:
        return (
            has_special(tokenizer, "<|im_start|>", "<tool_call>")
            and template_has(tokenizer, "<tool_call>", "<|im_start|>")
            and not template_has(tokenizer, "<think>")
            and not template_has(tokenizer, "<function=")
        )
