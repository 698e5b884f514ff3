"""GLM-4.5/4.6/4.7: reasoning in ``<think>`` (the generation prompt opens it), then calls as
``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>``.

Values are raw text as the template writes them (strings as they are, anything else as JSON),
typed back by the tool's schema as Qwen3-Coder's are.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from polar.providers.types import ToolCall
from polar.rendering.parsers.base import (
    MalformedCall,
    ParsedTurn,
    ToolParser,
    new_call,
    tool_parameters,
)
from polar.rendering.parsers.qwen3_coder import convert_value
from polar.rendering.parsers.think import split_think

_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_PAIR_RE = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _call(block: str, tools: list[dict[str, Any]] | None) -> ToolCall:
    name, _, rest = block.partition("<arg_key>")
    name = name.strip()
    if not name or "<" in name:
        raise MalformedCall("a GLM tool call starts with the function name")
    body = "<arg_key>" + rest if rest else ""
    properties = tool_parameters(tools, name) or {}
    args: dict[str, Any] = {}
    end = 0
    for m in _PAIR_RE.finditer(body):
        if body[end : m.start()].strip():
            raise MalformedCall("text between arguments")
        key = m.group(1).strip()
        if not key or key in args:
            raise MalformedCall(f"empty or repeated argument {key!r}")
        args[key] = convert_value(m.group(2), properties.get(key))
        end = m.end()
    if body[end:].strip():
        raise MalformedCall("text after the last argument")
    return new_call(name, args)


class Glm47ToolParser(ToolParser):
    """``<tool_call>NAME<arg_key>..</arg_key><arg_value>..</arg_value></tool_call>`` calls."""

    name = "glm47"

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedTurn:
        reasoning, rest = split_think(text)
        return replace(self._parse_calls(rest, tools), reasoning=reasoning)

    def _parse_calls(self, text: str, tools: list[dict[str, Any]] | None) -> ParsedTurn:
        matches = list(_CALL_RE.finditer(text))
        if not matches:
            return ParsedTurn(content=text.strip(), reasoning=None, tool_calls=[])
        try:
            calls = [_call(m.group(1), tools) for m in matches]
        except MalformedCall:
            return ParsedTurn(content=text, reasoning=None, tool_calls=[])
        content = text[: matches[0].start()].strip()
        return ParsedTurn(content=content, reasoning=None, tool_calls=calls)
