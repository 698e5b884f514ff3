"""GLM-4.5/4.6/4.7: ``[gMASK]<sop>`` prompts, ``<|role|>`` markers and no turn-closing token.

A call turn ends with the sampled ``<|observation|>``, an answer with ``<|user|>``: the token
that ends a sampled turn is the one history writes to open the next message, so a splice keeps
the sampled one and does not write it again. The template drops reasoning before the latest
user message (``clear_thinking``), hence ``reasoning_history: drop``.
"""

from __future__ import annotations

from typing import Any

from polar.rendering.families.base import Family, Features, has_special, template_has

_MARKUP = ("<think>", "</think>", "<tool_call>", "</tool_call>")
_ARGUMENTS = ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")


class Glm47Family(Family):
    name = "glm47"
    tool_parser = "glm47"
    turn_ends = ("<|observation|>", "<|user|>", "<|endoftext|>")
    parse_specials = _MARKUP + _ARGUMENTS
    reasoning_history = "drop"
    features = Features(reasoning=True)

    def matches(self, tokenizer: Any) -> bool:
        return has_special(tokenizer, "<|observation|>", "<|user|>") and template_has(
            tokenizer, "<arg_key>", "<|observation|>"
        )
