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

from polar.rendering.call_patterns import OPEN_TEXT, WS, alternatives, literal, parameter_names
from polar.rendering.parsers.base import (
    MalformedCall,
    ParsedTurn,
    ToolParser,
)
from polar.rendering.parsers.qwen3_coder import convert_value
from polar.rendering.parsers.special_text import (
    invoke_calls,
    keyed_arguments,
    only_matches,
    strip_trailers,
)
from polar.rendering.parsers.think import split_think

BLOCK_OPEN = "<minimax:tool_call>"
BLOCK_CLOSE = "</minimax:tool_call>"
# The turn-end token, when the caller left it on the text.
TRAILERS = ("[e~[",)
_BLOCK_RE = re.compile(re.escape(BLOCK_OPEN) + r"(.*?)" + re.escape(BLOCK_CLOSE), re.DOTALL)
_INVOKE_RE = re.compile(
    r"""<invoke\s+name\s*=\s*(["'])(?P<name>.*?)\1\s*>(?P<body>.*?)</invoke>""", re.DOTALL
)
_PARAMETER_RE = re.compile(
    r"""<parameter\s+name\s*=\s*(["'])(.*?)\1\s*>(.*?)</parameter>""", re.DOTALL
)


def _arguments(body: str, properties: dict[str, Any]) -> dict[str, Any]:
    params = [
        (m.group(2).strip(), m.group(3)) for m in only_matches(_PARAMETER_RE, body, "parameters")
    ]
    return keyed_arguments((name, convert_value(raw, properties.get(name))) for name, raw in params)


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
            calls = [
                c for m in blocks for c in invoke_calls(_INVOKE_RE, m.group(1), tools, _arguments)
            ]
        except MalformedCall:
            return ParsedTurn(content=text, reasoning=None, tool_calls=[])
        content = text[: blocks[0].start()].rstrip("\n")
        return ParsedTurn(content=content, reasoning=None, tool_calls=calls)
