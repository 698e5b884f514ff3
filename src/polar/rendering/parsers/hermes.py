"""Hermes-style JSON tool calls (Hermes, Qwen2.5, SmolLM2 with our tool text).

The model emits one block per call after its visible text::

    <tool_call>
    {"name": "read", "arguments": {"path": "a.txt"}}
    </tool_call>

``arguments`` may also be a JSON string of an object. Content is the text before the first
block; text between or after blocks is not part of the reply (vLLM's hermes parser does the same).
"""

from __future__ import annotations

import re
from typing import Any

from polar.providers.types import ToolCall
from polar.rendering.call_patterns import tagged_hermes_calls
from polar.rendering.parsers.base import (
    MalformedCall,
    ParsedTurn,
    ToolParser,
    arguments_object,
    loads_json,
    new_call,
)

_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _call(body: str) -> ToolCall:
    obj = loads_json(body)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise MalformedCall("a tool call needs a string name")
    return new_call(obj["name"], arguments_object(obj.get("arguments", {})))


class HermesToolParser(ToolParser):
    """``<tool_call>`` blocks holding ``{"name", "arguments"}`` JSON."""

    name = "hermes"

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedTurn:
        matches = list(_CALL_RE.finditer(text))
        if not matches:
            return ParsedTurn(content=text, reasoning=None, tool_calls=[])
        try:
            calls = [_call(m.group(1)) for m in matches]
        except MalformedCall:
            return ParsedTurn(content=text, reasoning=None, tool_calls=[])
        content = text[: matches[0].start()].rstrip("\n")
        return ParsedTurn(content=content, reasoning=None, tool_calls=calls)

    def call_pattern(self, functions: list[dict[str, Any]], parallel: bool) -> str | None:
        return tagged_hermes_calls(functions, parallel)
