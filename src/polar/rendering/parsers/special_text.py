"""What parsers of text decoded with special tokens kept share (Kimi, MiniMax, DeepSeek, gpt-oss).

Such text may still end with the token that closed the turn, depending on how the caller
decoded it; each family strips its own before reading the turn.
"""

from __future__ import annotations

import json
from typing import Any

from polar.providers.types import ToolCall

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
