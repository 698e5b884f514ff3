"""Qwen3: an optional leading ``<think>`` block, then Hermes-style ``<tool_call>`` JSON blocks.

The reasoning is split off first, so a ``<tool_call>`` the model only thought about is never a
call. A malformed call leaves the reasoning split off and the rest as plain content.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from polar.rendering.call_patterns import with_thinking
from polar.rendering.parsers.base import ParsedTurn
from polar.rendering.parsers.hermes import HermesToolParser
from polar.rendering.parsers.think import split_think


class Qwen3ToolParser(HermesToolParser):
    """Reasoning in ``<think>``, calls as in :class:`HermesToolParser`."""

    name = "qwen3"

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedTurn:
        reasoning, rest = split_think(text)
        return replace(super().parse(rest, tools), reasoning=reasoning)

    def call_pattern(self, functions: list[dict[str, Any]], parallel: bool) -> str | None:
        calls = super().call_pattern(functions, parallel)
        return None if calls is None else with_thinking(calls)
