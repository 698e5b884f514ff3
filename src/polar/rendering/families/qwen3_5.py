"""Qwen3.5: thinking by default, XML calls (``<tool_call><function=..><parameter=..>``),
reasoning before the latest user query dropped by the template (``reasoning_history: drop``)."""

from __future__ import annotations

from typing import Any

from polar.rendering.families.base import Family, Features, has_special, template_has


class Qwen35Family(Family):
    name = "qwen3_5"
    tool_parser = "qwen3_coder"
    turn_ends = ("<|im_end|>",)
    reasoning_history = "drop"
    features = Features(reasoning=True, images=True)

    def matches(self, tokenizer: Any) -> bool:
        return has_special(tokenizer, "<|im_start|>", "<think>") and template_has(
            tokenizer, "<function=", "<think>"
        )
