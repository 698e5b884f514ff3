"""Qwen3 (hybrid thinking): ``<think>`` reasoning, then ``<tool_call>`` JSON calls.

Its template drops the reasoning of assistant turns before the latest user query, so the
default ``reasoning_history`` is ``drop``: a prompt after a new user query is rendered whole,
as vLLM would render it.
"""

from __future__ import annotations

from typing import Any

from polar.rendering.families.base import Family, Features, has_special, template_has


class Qwen3Family(Family):
    name = "qwen3"
    tool_parser = "qwen3"
    turn_ends = ("<|im_end|>",)
    reasoning_history = "drop"
    features = Features(reasoning=True)

    def matches(self, tokenizer: Any) -> bool:
        return (
            has_special(tokenizer, "<|im_start|>", "<tool_call>", "<think>")
            and template_has(tokenizer, "<tool_call>", "<think>")
            and not template_has(tokenizer, "<function=")
        )
