"""Qwen3-Next and Qwen3-Thinking-2507: Qwen3's format, always thinking (the generation prompt
opens ``<think>``, so the sampled turn starts inside the thought)."""

from __future__ import annotations

from typing import Any

from polar.rendering.families.base import template_has
from polar.rendering.families.qwen3 import Qwen3Family


class Qwen3NextFamily(Qwen3Family):
    name = "qwen3_next"

    def matches(self, tokenizer: Any) -> bool:
        return super().matches(tokenizer) and template_has(
            tokenizer, "'<|im_start|>assistant\\n<think>\\n'"
        )
