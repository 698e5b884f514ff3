"""What parsers of text decoded with special tokens kept share (Kimi, MiniMax, DeepSeek, gpt-oss).

Such text may still end with the token that closed the turn, depending on how the caller
decoded it; each family strips its own before reading the turn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from polar.providers.types import ToolCall
from polar.rendering.parsers.base import MalformedCall, new_call, tool_parameters

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def strip_trailers(text: str, trailers: tuple[str, ...]) -> str:
    """``text`` without any of ``trailers`` (turn-end and eos tokens) at its end."""
    changed = True
    while changed:
        changed = False
        for token in trailers:
            if token and text.endswith(token):
                text, changed = text[: -len(token)], True
    return text


def call_with_id(call_id: str, name: str, arguments: dict[str, Any]) -> ToolCall:
    """A call that keeps the model's own id (its template renders that id back)."""
    return ToolCall(id=call_id, name=name, arguments=json.dumps(arguments, ensure_ascii=False))


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, rest) around the first ``</think>``, byte for byte (templates that write the
    thought back unchanged); the generation prompt has usually opened ``<think>`` already."""
    head, closed, rest = text.partition(THINK_CLOSE)
    if not closed:
        if text.startswith(THINK_OPEN):
            return text[len(THINK_OPEN) :], ""
        return None, text
    return head.removeprefix(THINK_OPEN), rest


def only_matches(pattern: re.Pattern[str], text: str, what: str) -> list[re.Match[str]]:
    """Every match of ``pattern`` in ``text``, which may hold nothing else but whitespace (a
    call section only its calls, an invoke only its parameters), else :class:`MalformedCall`."""
    matches: list[re.Match[str]] = []
    end = 0
    for m in pattern.finditer(text):
        if text[end : m.start()].strip():
            raise MalformedCall(f"text between {what}")
        matches.append(m)
        end = m.end()
    if text[end:].strip():
        raise MalformedCall(f"text after the last of the {what}")
    return matches


def keyed_arguments(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Arguments from (name, value) pairs; an empty or repeated name is a :class:`MalformedCall`."""
    args: dict[str, Any] = {}
    for name, value in pairs:
        if not name or name in args:
            raise MalformedCall(f"empty or repeated parameter {name!r}")
        args[name] = value
    return args


def invoke_calls(
    invoke: re.Pattern[str],
    block: str,
    tools: list[dict[str, Any]] | None,
    arguments: Callable[[str, dict[str, Any]], dict[str, Any]],
) -> list[ToolCall]:
    """The calls of a block of ``<invoke name=..>`` elements (MiniMax's XML, DeepSeek's DSML):
    ``invoke`` has the groups ``name`` and ``body``; ``arguments(body, properties)`` reads one
    invoke's parameters against its tool's schema properties."""
    calls = []
    for m in only_matches(invoke, block, "invokes"):
        name = m.group("name").strip()
        if not name:
            raise MalformedCall("empty function name")
        calls.append(new_call(name, arguments(m.group("body"), tool_parameters(tools, name) or {})))
    if not calls:
        raise MalformedCall("a call block without invokes")
    return calls
