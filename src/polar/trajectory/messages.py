"""Reading a captured call's normalized chat messages (``upstream_request["messages"]``)."""

from __future__ import annotations

import json
from typing import Any

from polar.capture.records import CaptureRecord


def content_text(content: Any) -> str:
    """The text of a chat message's content: a string, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def messages(call: CaptureRecord) -> list[dict[str, Any]]:
    """The chat messages the call's prompt was rendered from."""
    return list(call.upstream_request.get("messages") or [])


def reply_text(call: CaptureRecord) -> str:
    """The text of the call's reply (its tool calls aside)."""
    return content_text(call.response.get("content")).strip()


def reply_call_strings(call: CaptureRecord) -> list[str]:
    """The string arguments of the tool calls in the call's reply (a sub-agent's prompt, for a
    call that spawned one)."""
    out: list[str] = []
    for tool_call in call.response.get("tool_calls") or []:
        arguments = (tool_call.get("function") or {}).get("arguments")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            continue
        if isinstance(parsed, dict):
            out += [value for value in parsed.values() if isinstance(value, str)]
    return out


def first_user_text(call: CaptureRecord) -> str:
    """The text of the call's first user message."""
    for message in messages(call):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""
