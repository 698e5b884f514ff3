"""SmolLM2-Instruct: ChatML, Hermes-style ``<tool_call>`` JSON through Polar's own template.

SmolLM2's published template knows no tools; Polar ships ``smollm2_tools.jinja``, which vLLM
can serve too (``--chat-template``), so both sides render tools the same way.
"""

from __future__ import annotations

from typing import Any

from polar.rendering.chat_template import SMOLLM2_TOOLS_TEMPLATE
from polar.rendering.families.base import Family, has_special, template_has


class SmolLM2Family(Family):
    name = "smollm2"
    tool_parser = "hermes"
    turn_ends = ("<|im_end|>",)
    bundled = SMOLLM2_TOOLS_TEMPLATE

    def matches(self, tokenizer: Any) -> bool:
        return has_special(tokenizer, "<|im_start|>", "<|im_end|>") and (
            template_has(tokenizer, "SmolLM") or len(tokenizer) == 49152
        )
