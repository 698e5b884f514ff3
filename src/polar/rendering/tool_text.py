"""Tool calling for chat templates that know nothing about tools (SmolLM2's among them).

Such a template ignores ``tools`` and drops assistant ``tool_calls`` from history, so the next
prompt would not contain the previous turn and prefix merging could not chain. Engines serving
such a model render tools themselves, in the Hermes format that small instruct models know:

* tool definitions go into the system message, inside ``<tools>...</tools>``;
* a past assistant tool call becomes ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  byte-identical to what the model samples when it calls a tool;
* a tool result becomes a user turn wrapped in ``<tool_response>...</tool_response>``.

:func:`parse_tool_calls` reads the same format back out of sampled text. The sampled token ids
are never changed by this; only the structured view of them is.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from polar.errors import InvalidRequest
from polar.rendering.parsers.hermes import HermesToolParser

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def template_supports_tools(chat_template: str | None) -> bool:
    return bool(chat_template) and "tools" in str(chat_template)


def render_tool_call(name: str, arguments: str | dict[str, Any]) -> str:
    """The exact text of one call, as the model is asked to emit it."""
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments) if arguments else {}
    return (
        "<tool_call>\n"
        + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        + "\n</tool_call>"
    )


def render_tools_block(tools: list[dict[str, Any]]) -> str:
    lines = [json.dumps(t, ensure_ascii=False) for t in tools]
    return TOOLS_HEADER + "\n".join(lines) + TOOLS_FOOTER


def flatten_content(content: Any) -> str:
    """Message content as one string. Only text parts reach here: images are refused by name
    (or sent to a multimodal engine) before any render, never turned into text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    pieces = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InvalidRequest(f"a {kind!r} content part cannot be rendered as text")
        pieces.append(str(part.get("text", "")))
    return "\n".join(pieces)


def assistant_text(content: str, tool_calls: list[dict[str, Any]] | None) -> str:
    """An assistant turn's full text: its content followed by its rendered tool calls."""
    calls = [
        render_tool_call(c["function"]["name"], c["function"].get("arguments") or "{}")
        for c in tool_calls or []
    ]
    if not calls:
        return content
    return (content + "\n" if content else "") + "\n".join(calls)


def messages_for_plain_template(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """Messages with string content only, tools in the system prompt, calls rendered as text."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        role = msg.get("role", "user")
        content = flatten_content(msg.get("content"))
        if role == "assistant":
            out.append(
                {"role": "assistant", "content": assistant_text(content, msg.get("tool_calls"))}
            )
        elif role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": role, "content": content})
    if tools:
        block = render_tools_block(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split sampled text into (content, chat-completions tool_calls), as the Hermes parser does.

    Any malformed call makes the whole text plain content; see
    :mod:`polar.rendering.parsers.hermes`, the one implementation of this format.
    """
    turn = HermesToolParser().parse(text)
    calls = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in turn.tool_calls
    ]
    return turn.content, calls
