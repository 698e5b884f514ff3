"""What a parser returns, the interface every family implements, and what they all share.

A parser reads the decoded sampled text (special tokens already removed, end-of-turn stripped)
and never changes it: the token ids stay as sampled; only their structured view is built here.

Policies every family follows:

* Any malformed call makes the whole turn plain content with no tool calls: a half-parsed turn
  would hand the harness a call the model did not make.
* Calls to tool names not in ``tools`` are kept: the harness answers them with its own
  "unknown tool" error, which is the feedback the model should learn from.
* ``arguments`` is always a JSON object, rendered with ``json.dumps(args, ensure_ascii=False)``;
  NaN, Infinity and overflowing floats are refused (they are not JSON, and a harness's parser would choke on them).
"""

from __future__ import annotations

import json
import math
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from polar.errors import MalformedCall
from polar.providers.types import ToolCall


@dataclass
class ParsedTurn:
    """One sampled assistant turn, split into what a provider reply needs."""

    content: str
    reasoning: str | None
    tool_calls: list[ToolCall]


class ToolParser(ABC):
    """Parses one model family's sampled text; stateless, so one instance serves every call."""

    name: ClassVar[str]

    @abstractmethod
    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedTurn:
        """Split ``text`` into content, reasoning and tool calls (``tools``: chat-completions)."""

    def call_pattern(self, functions: list[dict[str, Any]], parallel: bool) -> str | None:
        """A regex over the sampled text that only this format's calls to one of ``functions``
        (chat-completions ``function`` objects) match, one or (``parallel``) more; the engine's
        structured output enforces it for ``tool_choice`` (see :mod:`polar.rendering.call_patterns`).
        None: this format cannot force a call, and the gateway refuses such a ``tool_choice``."""
        return None


def new_call(name: str, arguments: dict[str, Any]) -> ToolCall:
    """A call with a fresh ``call_`` id, the form chat-completions clients expect."""
    return ToolCall(
        id="call_" + uuid.uuid4().hex[:24],
        name=name,
        arguments=json.dumps(arguments, ensure_ascii=False),
    )


def _refuse_constant(token: str) -> Any:
    raise MalformedCall(f"{token} is not JSON")


def _finite_float(token: str) -> float:
    # 1e400 decodes to inf, which json.dumps would write back as the non-JSON Infinity.
    value = float(token)
    if not math.isfinite(value):
        raise MalformedCall(f"{token} overflows a float")
    return value


STRICT_JSON = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def loads_json(text: str) -> Any:
    """``json.loads`` that refuses NaN/Infinity; any failure is a :class:`MalformedCall`."""
    try:
        return STRICT_JSON.decode(text)
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        raise MalformedCall(str(exc)) from exc


def arguments_object(value: Any) -> dict[str, Any]:
    """Arguments as a dict; models emit an object or a JSON string of one."""
    if isinstance(value, str):
        value = loads_json(value)
    if not isinstance(value, dict):
        raise MalformedCall("arguments are not a JSON object")
    return value


def tool_parameters(tools: list[dict[str, Any]] | None, name: str) -> dict[str, Any] | None:
    """The JSON-schema ``properties`` of tool ``name``, or None when the tool is unknown."""
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            parameters = function.get("parameters")
            if isinstance(parameters, dict) and isinstance(parameters.get("properties"), dict):
                return parameters["properties"]
            return {}
    return None
