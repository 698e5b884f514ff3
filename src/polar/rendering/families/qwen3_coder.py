"""Qwen3-Coder: XML calls (``<tool_call><function=..><parameter=..>``), no reasoning."""

from __future__ import annotations

from typing import Any

from polar.rendering.families.base import Family, has_special, template_has


class Qwen3CoderFamily(Family):
    name = "qwen3_coder"
    tool_parser = "qwen3_coder"
    turn_ends = ("<|im_end|>",)

    def matches(self, tokenizer: Any) -> bool:
        return (
            has_special(tokenizer, "<|im_start|>")
            and template_has(tokenizer, "<function=")
            and not template_has(tokenizer, "<think>")
        )
