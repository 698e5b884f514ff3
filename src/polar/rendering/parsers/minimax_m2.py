"""MiniMax M2 / M2.5 / M2.7 tool calls: ``<minimax:tool_call>`` blocks of ``<invoke>`` XML.

After its generation prompt (``]~b]ai\\n<think>\\n``) the model writes its reasoning,
``</think>``, its visible text, then its calls, all in one block::

    <minimax:tool_call>
    <invoke name="bash">
    <parameter name="cmd">ls -la</parameter>
    </invoke>
    <invoke name="read">...</invoke>
    </minimax:tool_call>

A value is raw text as the template writes it (strings as they are, everything else as JSON),
so the tool's schema types it, exactly as for Qwen3-Coder. Reasoning and content are split the
way the template itself splits a turn it renders back (``strip('\\n')`` around the thought).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from polar.providers.types import ToolCall
from polar.rendering.call_patterns import OPEN_TEXT, WS, alternatives, literal, parameter_names
from polar.rendering.parsers.base import (
    MalformedCall,
    ParsedTurn,
    ToolParser,
    new_call,
    tool_parameters,
)
from polar.rendering.parsers.qwen3_coder import convert_value
from polar.rendering.parsers.special_text import strip_trailers
from polar.rendering.parsers.think import split_think

BLOCK_OPEN = "<minimax:tool_call>"
BLOCK_CLOSE = "</minimax:tool_call>"
# The turn-end token, when the caller left it on the text.
TRAILERS = ("[e~[",)
_BLOCK_RE = re.compile(re.escape(BLOCK_OPEN) + r"(.*?)" + re.escape(BLOCK_CLOSE), re.DOTALL)
_INVOKE_RE = re.compile(r"""<invoke\s+name\s*=\s*(["'])(.*?)\1\s*>(.*?)</invoke>""", re.DOTALL)
_PARAMETER_RE = re.compile(
    r"""<parameter\s+name\s*=\s*(["'])(.*?)\1\s*>(.*?)</parameter>""", re.DOTALL
)


def _arguments(body: str, properties: dict[str, Any]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    end = 0
    for m in _PARAMETER_RE.finditer(body):
        if body[end : m.start()].strip():
            raise MalformedCall("text between parameters")
        name = m.group(2).strip()
        if not name or name in args:
            raise MalformedCall(f"empty or repeated parameter {name!r}")
        args[name] = convert_value(m.group(3), properties.get(name))
        end = m.end()
    if body[end:].strip():
        raise MalformedCall("text after the last parameter")
    return args


def _calls(block: str, tools: list[dict[str, Any]] | None) -> list[ToolCall]:
    calls = []
    end = 0
    for m in _INVOKE_RE.finditer(block):
        if block[end : m.start()].strip():
            raise MalformedCall("text between invokes")
        name = m.group(2).strip()
        if not name:
            raise MalformedCall("empty function name")
        calls.append(new_call(name, _arguments(m.group(3), tool_parameters(tools, name) or {})))
        end = m.end()
    if block[end:].strip() or not calls:
        raise MalformedCall("a call block must hold only complete invokes")
    return calls


class MiniMaxM2ToolParser(ToolParser):
    """``<minimax:tool_call><invoke name=..><parameter name=..>`` XML, typed by the schema."""

    name = "minimax_m2"

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedTurn:
        reasoning, rest = split_think(strip_trailers(text, TRAILERS))
        return replace(self._parse_calls(rest, tools), reasoning=reasoning)

    def call_pattern(self, functions: list[dict[str, Any]], parallel: bool) -> str | None:
        """Right after the thought (the prompt opened ``<think>``), one block of invokes."""
        invokes = []
        for function in functions:
            names = parameter_names(function)
            key = alternatives([literal(n) for n in names]) if names else '[^"\\n]+'
            parameter = f'<parameter name="{key}">{OPEN_TEXT}</parameter>\\n'
            name = literal(str(function.get("name")))
            invokes.append(f'<invoke name="{name}">\\n({parameter})*</invoke>\\n')
        invoke = alternatives(invokes)
        calls = f"{invoke}+" if parallel else invoke
        return f"({OPEN_TEXT}</think>{WS})?{literal(BLOCK_OPEN)}\\n{calls}{literal(BLOCK_CLOSE)}"

    def _parse_calls(self, text: str, tools: list[dict[str, Any]] | None) -> ParsedTurn:
        blocks = list(_BLOCK_RE.finditer(text))
        if not blocks:
            return ParsedTurn(content=text, reasoning=None, tool_calls=[])
        try:
            calls = [call for m in blocks for call in _calls(m.group(1), tools)]
        except MalformedCall:
            return ParsedTurn(content=text, reasoning=None, tool_calls=[])
        content = text[: blocks[0].start()].rstrip("\n")
        return ParsedTurn(content=content, reasoning=None, tool_calls=calls)
