# ruff: noqa: RUF002  (DeepSeek's markup is spelled with fullwidth bars)
"""DeepSeek V3.2 tool calls: DSML blocks, as its official encoder renders and parses them.

In thinking mode the prompt ends with ``<think>``; the model writes its reasoning,
``</think>``, its visible text, then (two newlines after the text) all calls of the turn::

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="bash">
    <｜DSML｜parameter name="cmd" string="true">ls -la</｜DSML｜parameter>
    <｜DSML｜parameter name="timeout" string="false">30</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls><｜end▁of▁sentence｜>

``string="true"`` marks a raw string; ``"false"`` a JSON value (a value that is not JSON is
typed by the tool's schema, as for Qwen3-Coder). Reasoning and content are kept byte for byte,
as the encoder writes them back (``{reasoning}</think>{content}\\n\\n{calls}``).
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
    loads_json,
)
from polar.rendering.parsers.qwen3_coder import convert_value
from polar.rendering.parsers.special_text import (
    invoke_calls,
    keyed_arguments,
    only_matches,
    split_reasoning,
    strip_trailers,
)

DSML = "｜DSML｜"
BLOCK_OPEN = f"<{DSML}function_calls>"
BLOCK_CLOSE = f"</{DSML}function_calls>"
EOS = "<｜end▁of▁sentence｜>"
_BLOCK_RE = re.compile(re.escape(BLOCK_OPEN) + r"(.*?)" + re.escape(BLOCK_CLOSE), re.DOTALL)
_INVOKE_RE = re.compile(
    rf"""<{DSML}invoke\s+name\s*=\s*"(?P<name>.*?)"\s*>(?P<body>.*?)</{DSML}invoke>""", re.DOTALL
)
_PARAMETER_RE = re.compile(
    rf"""<{DSML}parameter\s+name\s*=\s*"(.*?)"(?:\s+string\s*=\s*"(true|false)")?\s*>"""
    rf"(.*?)</{DSML}parameter>",
    re.DOTALL,
)


def _value(raw: str, is_string: str | None, schema: Any) -> Any:
    if is_string == "true":
        return raw
    if is_string == "false":
        try:
            return loads_json(raw)
        except MalformedCall:
            pass
    return convert_value(raw, schema)


def _arguments(body: str, properties: dict[str, Any]) -> dict[str, Any]:
    params = [(m.group(1).strip(), m) for m in only_matches(_PARAMETER_RE, body, "parameters")]
    return keyed_arguments(
        (name, _value(m.group(3), m.group(2), properties.get(name))) for name, m in params
    )


class DeepSeekV32ToolParser(ToolParser):
    """``<｜DSML｜function_calls>`` blocks; reasoning before ``</think>`` in thinking mode."""

    name = "deepseek_v32"

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedTurn:
        reasoning, rest = split_reasoning(strip_trailers(text, (EOS,)))
        return replace(self._parse_calls(rest, tools), reasoning=reasoning)

    def call_pattern(self, functions: list[dict[str, Any]], parallel: bool) -> str | None:
        """One DSML block of invokes, as the encoder writes them (no thought: that is the
        family's, which knows whether the prompt opened ``<think>``)."""
        invokes = []
        for function in functions:
            names = parameter_names(function)
            key = alternatives([literal(n) for n in names]) if names else '[^"\\n]+'
            parameter = (
                f'<{DSML}parameter name="{key}" string="(true|false)">{OPEN_TEXT}</{DSML}parameter>'
            )
            name = literal(str(function.get("name")))
            invokes.append(
                f'<{DSML}invoke name="{name}">\\n({parameter}(\\n{parameter})*)?\\n</{DSML}invoke>'
            )
        invoke = alternatives(invokes)
        calls = f"{invoke}(\\n{invoke})*" if parallel else invoke
        return f"{WS}{BLOCK_OPEN}\\n{calls}\\n{BLOCK_CLOSE}"

    def _parse_calls(self, text: str, tools: list[dict[str, Any]] | None) -> ParsedTurn:
        blocks = list(_BLOCK_RE.finditer(text))
        if not blocks:
            return ParsedTurn(content=text, reasoning=None, tool_calls=[])
        try:
            if text[blocks[-1].end() :].strip():
                raise MalformedCall("text after the calls")
            calls = [
                c for m in blocks for c in invoke_calls(_INVOKE_RE, m.group(1), tools, _arguments)
            ]
        except MalformedCall:
            return ParsedTurn(content=text, reasoning=None, tool_calls=[])
        content = text[: blocks[0].start()]
        content = content[:-2] if content.endswith("\n\n") else content.rstrip("\n")
        return ParsedTurn(content=content, reasoning=None, tool_calls=calls)
