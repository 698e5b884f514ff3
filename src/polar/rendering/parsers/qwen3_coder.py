"""Qwen3-Coder XML tool calls (also Qwen3.5-style templates), with Qwen3 reasoning.

The model emits, after its visible text::

    <tool_call>
    <function=write_file>
    <parameter=path>
    a.txt
    </parameter>
    <parameter=overwrite>
    true
    </parameter>
    </function>
    </tool_call>

A value is raw text, not JSON: the chat template writes strings as they are, objects and arrays
as JSON, and other scalars with Jinja's ``string`` filter (so ``True`` as well as ``true``). The
tool's JSON schema therefore decides each value's type; without one, a value that parses as JSON
is that JSON and anything else is a string. A value that does not fit its schema type is kept as
best parsed: the harness checks arguments against its schema and tells the model itself.
A bare ``<function=...>`` block without ``<tool_call>`` (the model sometimes drops the wrapper;
vLLM accepts it too) is read the same way.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from polar.providers.types import ToolCall
from polar.rendering.call_patterns import qwen3_coder_calls, with_thinking
from polar.rendering.parsers.base import (
    MalformedCall,
    ParsedTurn,
    ToolParser,
    loads_json,
    new_call,
    tool_parameters,
)
from polar.rendering.parsers.think import split_think

_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_BARE_CALL_RE = re.compile(r"<function=[^>\n]*>.*?</function>", re.DOTALL)
_FUNCTION_RE = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_PARAMETER_RE = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "object": (dict,),
    "array": (list,),
}
_NULLS = ("null", "None")


def _schema_types(schema: Any) -> list[str]:
    """The JSON-schema type names a parameter allows ([] when the schema does not say)."""
    if not isinstance(schema, dict):
        return []
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [t for t in declared if isinstance(t, str)]
    variants = schema.get("anyOf") or schema.get("oneOf") or []
    return [t for v in variants if isinstance(v, dict) for t in _schema_types(v)]


def _as_json(raw: str) -> Any:
    """The JSON value ``raw`` spells, or ``raw`` itself (NaN and Infinity included)."""
    try:
        return loads_json(raw)
    except MalformedCall:
        return raw


def _as_type(raw: str, kind: str) -> tuple[bool, Any]:
    """(fits, value) for one schema type."""
    if kind == "boolean" and raw.strip().lower() in ("true", "false"):
        return True, raw.strip().lower() == "true"
    if kind == "null" and raw.strip() in _NULLS:
        return True, None
    expected = _JSON_TYPES.get(kind)
    if expected is not None:
        value = _as_json(raw)
        if isinstance(value, expected) and not isinstance(value, bool):
            return True, value
    return False, None


def convert_value(raw: str, schema: Any) -> Any:
    """A parameter's raw text as the type its schema gives (JSON-or-string without one).

    A schema that allows string keeps the text: ``"7"`` is as likely the string as the number.
    """
    types = _schema_types(schema)
    if "null" in types and raw.strip() in _NULLS:
        return None
    if "string" in types:
        return raw
    for kind in types:
        fits, value = _as_type(raw, kind)
        if fits:
            return value
    return _as_json(raw)


def _strip_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _arguments(body: str, properties: dict[str, Any]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    end = 0
    for m in _PARAMETER_RE.finditer(body):
        if body[end : m.start()].strip():
            raise MalformedCall("text between parameters")
        name = m.group(1).strip()
        if not name or name in args:
            raise MalformedCall(f"empty or repeated parameter {name!r}")
        args[name] = convert_value(_strip_one_newline(m.group(2)), properties.get(name))
        end = m.end()
    if body[end:].strip():
        raise MalformedCall("text after the last parameter")
    return args


def _call(block: str, tools: list[dict[str, Any]] | None) -> ToolCall:
    m = _FUNCTION_RE.fullmatch(block)
    if m is None:
        raise MalformedCall("a tool call needs one <function=...> block")
    name = m.group(1).strip()
    if not name:
        raise MalformedCall("empty function name")
    return new_call(name, _arguments(m.group(2), tool_parameters(tools, name) or {}))


class Qwen3CoderToolParser(ToolParser):
    """``<tool_call><function=...><parameter=...>`` XML, values typed by the tool's schema."""

    name = "qwen3_coder"

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedTurn:
        reasoning, rest = split_think(text)
        return replace(self._parse_calls(rest, tools), reasoning=reasoning)

    def call_pattern(self, functions: list[dict[str, Any]], parallel: bool) -> str | None:
        return with_thinking(qwen3_coder_calls(functions, parallel))

    def _parse_calls(self, text: str, tools: list[dict[str, Any]] | None) -> ParsedTurn:
        matches = list(_CALL_RE.finditer(text))
        blocks = [m.group(1) for m in matches]
        if not matches:
            matches = list(_BARE_CALL_RE.finditer(text))
            blocks = [m.group(0) for m in matches]
        if not matches:
            return ParsedTurn(content=text, reasoning=None, tool_calls=[])
        try:
            calls = [_call(block, tools) for block in blocks]
        except MalformedCall:
            return ParsedTurn(content=text, reasoning=None, tool_calls=[])
        content = text[: matches[0].start()].rstrip("\n")
        return ParsedTurn(content=content, reasoning=None, tool_calls=calls)
