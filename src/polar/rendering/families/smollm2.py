"""SmolLM2-Instruct: ChatML, Hermes-style ``<tool_call>`` JSON through Polar's own template.

SmolLM2's published template knows no tools; Polar ships ``smollm2_tools.jinja``, which vLLM
can serve too (``--chat-template``), so both sides render tools the same way.
"""

from __future__ import annotations

from typing import Any

from polar.rendering.chat_template import SMOLLM2_TOOLS_TEMPLATE
from polar.rendering.families.base import Family, has_special, template_has

# SmolLM2's added tokens (ChatML over a StarCoder-style vocabulary) and their ids.
_SMOLLM2_IDS = {
    "<|endoftext|>": 0,
    "<|im_start|>": 1,
    "<|im_end|>": 2,
    "<repo_name>": 3,
    "<jupyter_script>": 15,
    "<empty_output>": 16,
}


class SmolLM2Family(Family):
    name = "smollm2"
    tool_parser = "hermes"
    turn_ends = ("<|im_end|>",)
    bundled = SMOLLM2_TOOLS_TEMPLATE

    def matches(self, tokenizer: Any) -> bool:
        """A ChatML template over SmolLM2's own vocabulary (its added tokens at their ids).
        Never a name in the template (SmolLM3's names SmolLM too, over another vocabulary, with
        tools of its own) nor the vocabulary's size: another 49,152-token vocabulary is another
        model."""
        if not has_special(tokenizer, "<|im_start|>", "<|im_end|>"):
            return False
        vocab = tokenizer.get_vocab()
        own_ids = all(vocab.get(token) == i for token, i in _SMOLLM2_IDS.items())
        return own_ids and template_has(tokenizer, "<|im_start|>")
