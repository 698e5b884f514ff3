"""Reading a captured call's normalized chat messages (``upstream_request["messages"]``)."""

from __future__ import annotations

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
