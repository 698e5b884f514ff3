"""Tool parsers by name (or ``module:Class``), named as the engines name theirs."""

from __future__ import annotations

from polar.errors import ConfigError
from polar.registry import Registry
from polar.rendering.parsers.base import ToolParser
from polar.rendering.parsers.deepseek_v32 import DeepSeekV32ToolParser
from polar.rendering.parsers.glm47 import Glm47ToolParser
from polar.rendering.parsers.harmony import HarmonyToolParser
from polar.rendering.parsers.hermes import HermesToolParser
from polar.rendering.parsers.kimi_k2 import KimiK2ToolParser
from polar.rendering.parsers.llama3_json import Llama3JsonToolParser
from polar.rendering.parsers.minimax_m2 import MiniMaxM2ToolParser
from polar.rendering.parsers.qwen3 import Qwen3ToolParser
from polar.rendering.parsers.qwen3_coder import Qwen3CoderToolParser

TOOL_PARSERS: Registry[ToolParser] = Registry("tool parser")
for _parser in (
    HermesToolParser,
    Qwen3ToolParser,
    Qwen3CoderToolParser,
    Llama3JsonToolParser,
    Glm47ToolParser,
    KimiK2ToolParser,
    MiniMaxM2ToolParser,
    DeepSeekV32ToolParser,
    HarmonyToolParser,
):
    TOOL_PARSERS.add(_parser.name, _parser)


def get_tool_parser(name: str) -> ToolParser:
    """A parser instance; a ``module:Class`` that is not a :class:`ToolParser` is a config error."""
    parser = TOOL_PARSERS.create(name)
    if not isinstance(parser, ToolParser):
        raise ConfigError(f"tool parser {name!r} is not a ToolParser subclass")
    return parser
