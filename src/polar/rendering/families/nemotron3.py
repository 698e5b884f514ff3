"""NVIDIA Nemotron 3 (Nano 30B-A3B): ChatML turns, Qwen3-Coder XML calls, ``<think>`` reasoning.

The generation prompt opens ``<think>`` (``<think></think>`` with thinking off); the template
truncates reasoning before the latest user message (``truncate_history_thinking``), hence
``reasoning_history: drop``. Its fingerprint is a special case of Qwen3.5's (same markup), so it
is detected before Qwen3.5.
"""

from __future__ import annotations

from typing import Any

from polar.rendering.call_patterns import OPEN_TEXT, WS, qwen3_coder_calls
from polar.rendering.families.base import Family, Features, has_special, template_has


class Nemotron3Family(Family):
    name = "nemotron3"
    tool_parser = "qwen3_coder"
    turn_ends = ("<|im_end|>",)
    parse_specials = ("<think>", "</think>", "<tool_call>", "</tool_call>")
    reasoning_history = "drop"
    features = Features(reasoning=True)

    def matches(self, tokenizer: Any) -> bool:
        return has_special(tokenizer, "<|im_start|>", "<|im_end|>") and template_has(
            tokenizer, "truncate_history_thinking", "<function=", "<think></think>"
        )

    def call_pattern(self, functions: list[dict[str, Any]], parallel: bool) -> str | None:
        """The calls after an optional thought closed by ``</think>`` (the prompt opened it),
        with the newline the template writes after the last one."""
        return f"({OPEN_TEXT}</think>{WS})?" + qwen3_coder_calls(functions, parallel) + r"\n?"
