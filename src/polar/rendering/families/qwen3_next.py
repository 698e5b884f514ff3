"""Qwen3-Next and Qwen3-Thinking-2507: always thinking (the generation prompt opens
``<think>``), ``<tool_call>`` JSON calls; reasoning before the latest user query is dropped by
the template, hence ``reasoning_history: drop``."""

from __future__ import annotations

from typing import Any

from polar.rendering.families.base import Family, Features, has_special, template_has


class Qwen3NextFamily(Family):
    name = "qwen3_next"
    tool_parser = "qwen3"
    turn_ends = ("<|im_end|>",)
    reasoning_history = "drop"
    features = Features(reasoning=True)

    def matches(self, tokenizer: Any) -> bool:
        return (
            has_special(tokenizer, "<|im_start|>", "<tool_call>", "<think>")
            and template_has(tokenizer, "<tool_call>", "'<|im_start|>assistant\\n<think>\\n'")
            and not template_has(tokenizer, "<function=")
        )
