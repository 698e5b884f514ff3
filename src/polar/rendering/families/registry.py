"""Families by name (or ``module:Class``), and detection from the served model's tokenizer.

Detection asks each family in registration order whether a tokenizer is its own, so a family
whose fingerprint is a special case of another's (Qwen3.5 before Qwen3) is registered first.
"""

from __future__ import annotations

from typing import Any

from polar.errors import ConfigError
from polar.registry import Registry
from polar.rendering.families.base import Family, TokenizerFamily
from polar.rendering.families.deepseek_v32 import DeepSeekV32Family, DeepSeekV32ThinkingFamily
from polar.rendering.families.glm47 import Glm47Family
from polar.rendering.families.gpt_oss import GptOssFamily
from polar.rendering.families.kimi_k2 import KimiK2Family
from polar.rendering.families.llama3 import Llama3Family
from polar.rendering.families.minimax_m2 import MiniMaxM2Family
from polar.rendering.families.nemotron3 import Nemotron3Family
from polar.rendering.families.qwen2_5 import Qwen25Family
from polar.rendering.families.qwen3 import Qwen3Family
from polar.rendering.families.qwen3_5 import Qwen35Family
from polar.rendering.families.qwen3_coder import Qwen3CoderFamily
from polar.rendering.families.qwen3_next import Qwen3NextFamily
from polar.rendering.families.smollm2 import SmolLM2Family

FAMILIES: Registry[Family] = Registry("model family")
# Detection order: registration order, most specific fingerprint first.
DETECTION_ORDER: list[str] = []
for _family in (
    Glm47Family,
    Llama3Family,
    KimiK2Family,
    MiniMaxM2Family,
    DeepSeekV32Family,
    GptOssFamily,
    Nemotron3Family,  # before Qwen3.5: the same markup, plus its own template switches
    Qwen35Family,
    Qwen3CoderFamily,
    Qwen3NextFamily,
    Qwen3Family,
    Qwen25Family,
    SmolLM2Family,
):
    FAMILIES.add(_family.name, _family)
    DETECTION_ORDER.append(_family.name)
FAMILIES.add(TokenizerFamily.name, TokenizerFamily)  # by name only: it fingerprints nothing
FAMILIES.add(DeepSeekV32ThinkingFamily.name, DeepSeekV32ThinkingFamily)  # by name only


def get_family(name: str) -> Family:
    """A family instance; a ``module:Class`` that is not a :class:`Family` is a config error."""
    family = FAMILIES.create(name)
    if not isinstance(family, Family):
        raise ConfigError(f"model family {name!r} is not a Family subclass")
    return family


def detect_family(tokenizer: Any) -> Family | None:
    """The first registered family whose fingerprint matches ``tokenizer``, if any."""
    for name in DETECTION_ORDER:
        family = get_family(name)
        if family.matches(tokenizer):
            return family
    return None
