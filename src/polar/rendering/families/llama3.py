"""Llama 3.1 / 3.3: JSON calls ``{"name", "parameters"}`` (bare or after ``<|python_tag|>``).

The model ends a call turn with ``<|eom_id|>`` or ``<|eot_id|>``; history closes every custom
tool call with ``<|eot_id|>``. The template renders one call per turn and drops a call turn's
text, so parallel calls are not expressible.
"""

from __future__ import annotations

from typing import Any

from polar.rendering.families.base import Family, Features, has_special, template_has


class Llama3Family(Family):
    name = "llama3"
    tool_parser = "llama3_json"
    turn_ends = ("<|eot_id|>", "<|eom_id|>")
    history_ends = {"<|eom_id|>": "<|eot_id|>"}
    parse_specials = ("<|python_tag|>",)
    features = Features(parallel_tool_calls=False)

    def matches(self, tokenizer: Any) -> bool:
        return has_special(tokenizer, "<|start_header_id|>", "<|eot_id|>") and template_has(
            tokenizer, "<|start_header_id|>", '"parameters"'
        )
