"""The Interactions API's ``input`` as chat messages. Part of
:mod:`polar.providers.google_interactions`, which owns the request as a whole.

``input`` is a string, one content object, a list of contents (one user turn) or a list of typed
steps (a whole history). Steps fold as a turn was sampled: the ``thought``, ``model_output`` and
``function_call`` steps between two inputs are ONE assistant message (reasoning, text and every
call), so a replayed turn renders as the model produced it; ``function_result`` steps are tool
messages, ``user_input`` steps user messages. A thought's reasoning comes from our own signature
(exact), else from its summary. Steps of Google's built-in tools (search, code execution, ...)
belong to tools this gateway refuses, so they are refused by name too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

from polar.errors import InvalidRequest
from polar.providers.base import chat_content, join_text, require_dict, require_list
from polar.providers.reasoning_codec import decode_reasoning_b64
from polar.providers.types import Message

CONTENT_TYPES = ("text", "image", "audio", "document", "video")
_MODEL_STEPS = ("thought", "model_output", "function_call")
_MEDIA_REFUSED = (
    "the engines here take text and images only; send its text as a text content instead"
)


def input_messages(raw: Any) -> tuple[list[Message], list[dict[str, Any]]]:
    """The chat messages of ``input``, and ``input`` as steps (the stored timeline's start)."""
    if raw is None or raw in ("", []):
        raise InvalidRequest("input is required and must not be empty")
    if isinstance(raw, str):
        contents: list[Any] = [{"type": "text", "text": raw}]
        return [_user(contents, "input")], [_user_step(contents)]
    if isinstance(raw, dict):
        return [_user([raw], "input")], [_user_step([raw])]
    items = [require_dict(item, "input[]") for item in require_list(raw, "input")]
    if all(item.get("type") in CONTENT_TYPES for item in items):
        return [_user(items, "input")], [_user_step(items)]
    fold = _Fold()
    for index, step in enumerate(items):
        fold.add(step, f"input[{index}]")
    return fold.finish(), list(items)


def _user_step(contents: list[Any]) -> dict[str, Any]:
    return {"type": "user_input", "content": contents}


@dataclass
class _Fold:
    """Steps to chat messages, one assistant message per sampled turn."""

    messages: list[Message] = field(default_factory=list)
    turn: Message | None = None  # the assistant message of the model steps being folded

    def add(self, step: dict[str, Any], where: str) -> None:
        kind = step.get("type")
        if kind in _MODEL_STEPS:
            self._model_step(kind, step, where)
        elif kind == "user_input":
            self._close()
            self.messages.append(_user(require_list(step.get("content"), where), where))
        elif kind == "function_result":
            self._close()
            self.messages.append(_function_result(step, where))
        elif isinstance(kind, str) and kind.endswith(("_call", "_result")):
            raise InvalidRequest(
                f"{where}: a {kind!r} step belongs to a built-in tool that runs inside Google's "
                "service and is not available here; declare a function instead"
            )
        elif kind in CONTENT_TYPES:
            raise InvalidRequest(
                f"{where}: a list of steps cannot hold bare {kind!r} contents; put them in a "
                "user_input step"
            )
        else:
            raise InvalidRequest(f"{where}: unknown step type {kind!r}")

    def finish(self) -> list[Message]:
        self._close()
        return self.messages

    def _close(self) -> None:
        if self.turn is not None:
            self.messages.append(self.turn)
            self.turn = None

    def _model_step(self, kind: str, step: dict[str, Any], where: str) -> None:
        if self.turn is None:
            self.turn = {"role": "assistant", "content": ""}
        turn = self.turn
        if kind == "thought":
            reasoning = _thought(step, where)
            if reasoning:
                turn["reasoning"] = join_text([turn.get("reasoning") or "", reasoning])
        elif kind == "model_output":
            text = _model_text(step, where)
            turn["content"] = join_text([turn["content"], text])
        else:
            turn.setdefault("tool_calls", []).append(_function_call(step, where))


def _thought(step: dict[str, Any], where: str) -> str:
    """A thought's reasoning: our signature's text (exact), else its summary's text."""
    signed = decode_reasoning_b64(step.get("signature"))
    if signed is not None:
        return signed
    texts = []
    for index, part in enumerate(require_list(step.get("summary"), f"{where}.summary")):
        part = require_dict(part, f"{where}.summary[{index}]")
        if part.get("type") == "text":
            texts.append(_string(part.get("text"), f"{where}.summary[{index}].text"))
    return join_text(texts)


def _model_text(step: dict[str, Any], where: str) -> str:
    return _text_parts(
        require_list(step.get("content"), f"{where}.content"),
        f"{where}.content",
        "in a model_output step cannot be replayed to the engine (an assistant turn holds "
        "text only)",
    )


def _text_parts(parts: list[Any], where: str, refusal: str) -> str:
    """The text of ``parts``, joined; any other content type is refused with ``refusal``."""
    texts = []
    for index, part in enumerate(parts):
        at = f"{where}[{index}]"
        part = require_dict(part, at)
        if part.get("type") != "text":
            raise InvalidRequest(f"{at}: a {part.get('type')!r} content {refusal}")
        texts.append(_string(part.get("text"), f"{at}.text"))
    return join_text(texts)


def _function_call(step: dict[str, Any], where: str) -> dict[str, Any]:
    arguments = step.get("arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise InvalidRequest(f"{where}.arguments must be an object")
    return {
        "id": _string(step.get("id"), f"{where}.id"),
        "type": "function",
        "function": {
            "name": _string(step.get("name"), f"{where}.name"),
            "arguments": _json(arguments),
        },
    }


def _function_result(step: dict[str, Any], where: str) -> Message:
    """A tool message; an error result is prefixed ``Error:`` (as Anthropic's ``is_error``)."""
    call_id = _string(step.get("call_id"), f"{where}.call_id")
    if step.get("name") is not None:
        _string(step["name"], f"{where}.name")
    is_error = step.get("is_error", False)
    if not isinstance(is_error, bool):
        raise InvalidRequest(f"{where}.is_error must be a boolean")
    result = step.get("result")
    if result is None:
        raise InvalidRequest(f"{where}.result is required")
    if isinstance(result, str):
        text = result
    elif isinstance(result, dict):
        text = _json(result)
    else:
        text = _text_parts(
            require_list(result, f"{where}.result"),
            f"{where}.result",
            "in a function result cannot ride in a tool message; return text, or send the "
            "media in a user_input step",
        )
    if is_error:
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _user(contents: list[Any], where: str) -> Message:
    if not contents:
        raise InvalidRequest(f"{where}: a user input needs at least one content")
    parts = [
        _content(require_dict(c, f"{where}[]"), f"{where}[{i}]") for i, c in enumerate(contents)
    ]
    return {"role": "user", "content": chat_content(parts)}


def _content(part: dict[str, Any], where: str) -> dict[str, Any]:
    """One content as a chat content part: text, or an image (inline data or a URI)."""
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "text": _string(part.get("text"), f"{where}.text")}
    if kind == "image":
        if part.get("resolution") is not None:
            raise InvalidRequest(
                f"{where}.resolution: the engines here take an image at its own resolution"
            )
        if part.get("data") is not None:
            mime = _string(part.get("mime_type") or "image/png", f"{where}.mime_type")
            url = f"data:{mime};base64,{_string(part['data'], f'{where}.data')}"
        else:
            url = _string(part.get("uri"), f"{where}.uri")
        return {"type": "image_url", "image_url": {"url": url}}
    if kind in CONTENT_TYPES:
        raise InvalidRequest(f"{where}: {kind} content is not supported: {_MEDIA_REFUSED}")
    raise InvalidRequest(f"{where}: unknown content type {kind!r}")


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{what} must be a string")
    return value


def _json(value: Any) -> str:
    """Compact JSON in the client's key order; integers beyond 64 bits still serialize."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
