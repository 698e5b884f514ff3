"""Kimi K2 / K2.5 / K2.6 tool calls: special-token sections whose call ids are the model's own.

After its generation prompt (``<|im_assistant|>assistant<|im_middle|><think>``) the model writes
its reasoning, ``</think>``, its visible text, then every call of the turn in one section::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>
    {"cmd": "ls"}<|tool_call_end|><|tool_call_begin|>functions.read:1<|tool_call_argument_begin|>
    ...<|tool_call_end|><|tool_calls_section_end|>

All markers are special tokens: the text must be decoded with them kept. The id
(``functions.NAME:IDX``) is the model's and its template renders each result as
``## Return of <id>``, so the call keeps it: a fresh id would change the context the model
learns from. Reasoning and content are kept byte for byte, as the template writes them back.
No ``call_pattern``: engines' regex grammars do not sample special tokens, so ``tool_choice``
cannot be forced in this format and the gateway refuses it by name.
"""

from __future__ import annotations

import re
from typing import Any

from polar.providers.types import ToolCall
from polar.rendering.parsers.base import (
    MalformedCall,
    ParsedTurn,
    ToolParser,
    arguments_object,
    loads_json,
)
from polar.rendering.parsers.special_text import (
    call_with_id,
    only_matches,
    split_reasoning,
    strip_trailers,
)

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
# The turn-end and eos tokens, when the caller left them on the text.
TRAILERS = ("<|im_end|>", "[EOS]")
_CALL_RE = re.compile(
    re.escape(CALL_BEGIN) + r"(.*?)" + re.escape(ARGUMENT_BEGIN) + r"(.*?)" + re.escape(CALL_END),
    re.DOTALL,
)
# functions.NAME:IDX; NAME may itself contain dots and colons, IDX is the last ":digits".
_ID_RE = re.compile(r"(?:functions\.)?(.+):\d+")


def _call(raw_id: str, raw_arguments: str) -> ToolCall:
    call_id = raw_id.strip()
    m = _ID_RE.fullmatch(call_id)
    if m is None or not m.group(1).strip():
        raise MalformedCall(f"call id {call_id!r} is not functions.NAME:IDX")
    arguments = arguments_object(loads_json(raw_arguments.strip()))
    return call_with_id(call_id, m.group(1).strip(), arguments)


def _calls(section: str) -> list[ToolCall]:
    calls = [_call(m.group(1), m.group(2)) for m in only_matches(_CALL_RE, section, "calls")]
    if not calls:
        raise MalformedCall("an empty call section")
    return calls


class KimiK2ToolParser(ToolParser):
    """``<|tool_calls_section_begin|>`` sections; ids kept as the model wrote them."""

    name = "kimi_k2"

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedTurn:
        text = strip_trailers(text, TRAILERS)
        before_calls, sep, section = text.partition(SECTION_BEGIN)
        reasoning, content = split_reasoning(before_calls)
        if not sep:
            return ParsedTurn(content=content, reasoning=reasoning, tool_calls=[])
        body, closed, after = section.partition(SECTION_END)
        try:
            if not closed or after.strip():
                raise MalformedCall("the call section is not closed at the end of the turn")
            calls = _calls(body)
        except MalformedCall:
            return ParsedTurn(content=content + sep + section, reasoning=reasoning, tool_calls=[])
        return ParsedTurn(content=content, reasoning=reasoning, tool_calls=calls)
