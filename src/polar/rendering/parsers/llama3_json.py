"""Llama 3.x JSON tool calls: the whole turn is the call.

The Llama 3.1-3.3 templates render a past call as ``{"name": ..., "parameters": {...}}`` and ask
the model to answer with only that; it may emit several separated by ``;`` and may lead with
``<|python_tag|>`` (a special token, so usually already removed by decoding). ``"arguments"`` is
accepted for ``"parameters"``, as vLLM's llama3_json parser does. A turn that is not entirely
such calls (prose, or the built-in ``brave_search.call(...)`` Python form) is plain content.
"""

from __future__ import annotations

from typing import Any

from polar.providers.types import ToolCall
from polar.rendering.call_patterns import WS, hermes_call, repeated
from polar.rendering.parsers.base import (
    STRICT_JSON,
    MalformedCall,
    ParsedTurn,
    ToolParser,
    arguments_object,
    new_call,
)

PYTHON_TAG = "<|python_tag|>"


def _objects(text: str) -> list[Any]:
    """The JSON values of ``obj; obj; ...``; raises :class:`MalformedCall` on anything else."""
    values = []
    at = 0
    while at < len(text):
        try:
            value, at = STRICT_JSON.raw_decode(text, at)
        except ValueError as exc:  # MalformedCall (NaN) is a ValueError too
            raise MalformedCall(str(exc)) from exc
        values.append(value)
        while at < len(text) and text[at].isspace():
            at += 1
        if at < len(text):
            if text[at] != ";":
                raise MalformedCall("calls must be separated by ';'")
            at += 1
            while at < len(text) and text[at].isspace():
                at += 1
    return values


def _call(obj: Any) -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise MalformedCall("a tool call needs a string name")
    key = "parameters" if "parameters" in obj else "arguments"
    if key not in obj:
        raise MalformedCall("a tool call needs parameters")
    return new_call(obj["name"], arguments_object(obj[key]))


class Llama3JsonToolParser(ToolParser):
    """The turn as ``{"name", "parameters"}`` JSON objects, ``;``-separated."""

    name = "llama3_json"

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedTurn:
        body = text.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG) :].lstrip()
        if not body.startswith("{"):
            return ParsedTurn(content=text, reasoning=None, tool_calls=[])
        try:
            calls = [_call(obj) for obj in _objects(body)]
        except MalformedCall:
            return ParsedTurn(content=text, reasoning=None, tool_calls=[])
        return ParsedTurn(content="", reasoning=None, tool_calls=calls)

    def call_pattern(self, functions: list[dict[str, Any]], parallel: bool) -> str | None:
        return repeated(hermes_call(functions, "parameters"), parallel, f"{WS};{WS}")
