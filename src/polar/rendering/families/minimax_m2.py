"""MiniMax M2 / M2.5 / M2.7: ``<minimax:tool_call>`` blocks of ``<invoke>`` XML, ``]~b]role``
markers, turns closed by ``[e~[``.

The template refuses a tool result whose preceding assistant turn has no tool call (the splice
keeps the turn's calls for that reason) and drops reasoning before the latest user message,
hence ``reasoning_history: drop``.
"""

from __future__ import annotations

from typing import Any

from polar.rendering.families.base import Family, Features, has_special, template_has


class MiniMaxM2Family(Family):
    name = "minimax_m2"
    tool_parser = "minimax_m2"
    turn_ends = ("[e~[",)
    parse_specials = ("<minimax:tool_call>", "</minimax:tool_call>", "<think>", "</think>")
    reasoning_history = "drop"
    features = Features(reasoning=True)

    def matches(self, tokenizer: Any) -> bool:
        return has_special(tokenizer, "[e~[", "]~b]") and template_has(
            tokenizer, "<minimax:tool_call>"
        )
