"""The Responses API's input items folded into chat messages: one assistant message per sampled
turn (reasoning, text, calls), call outputs as tool messages, content parts as chat parts.
Part of :mod:`polar.providers.openai_responses`, which owns the request as a whole."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from polar.errors import InvalidRequest, NotFound
from polar.providers.base import (
    arguments_text,
    chat_content,
    join_text,
    optional_number,
    require_dict,
    require_list,
)
from polar.providers.reasoning_codec import decode_reasoning
from polar.providers.types import (
    Message,
)

LOCAL_SHELL = "local_shell"
NAMESPACE_DELIMITER = "__"

# Items that are sampled by the model, in the order one turn emits them. A new assistant
# message starts when an item's rank is below the open turn's (reasoning after a call), or when
# a second text message arrives; consecutive calls always join the open turn.
_REASONING, _CONTENT, _CALLS = 0, 1, 2

# OpenAI's server-side compaction: opaque state that only OpenAI's service makes or reads.
COMPACTION_ITEMS = {
    "compaction": "it holds OpenAI's encrypted summary of earlier turns, which only OpenAI's "
    "service can read",
    "compaction_trigger": "it asks OpenAI's service to compact the context into an encrypted "
    "compaction item",
    "context_compaction": "it holds OpenAI's encrypted compacted context, which only OpenAI's "
    "service can read",
}
COMPACT_LOCALLY = (
    "This gateway does no remote compaction; compact on the client instead: Codex compacts "
    "locally (a normal /responses call asking for a summary) with a custom model provider "
    "named neither 'OpenAI' nor 'azure', as Polar's codex preset writes it."
)

CALL_ITEMS = ("function_call", "custom_tool_call", "local_shell_call")
OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")


def optional_str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"{key} must be a string")
    return value


def required_str(item: Mapping[str, Any], key: str, what: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise InvalidRequest(f"{what} needs a string {key!r}")
    return value


def flat_tool_name(namespace: str, name: str) -> str:
    """A namespaced tool's one model-visible name, joined as Codex flattens its own where a
    boundary cannot keep the split (``ToolName::canonical_flat_name``): ``mcp__probe`` and
    ``lookup`` give ``mcp__probe__lookup``, and so does ``mcp__probe__`` (stray underscores
    around the delimiter are trimmed)."""
    return namespace.rstrip("_") + NAMESPACE_DELIMITER + name.lstrip("_")


def call_name(item: Mapping[str, Any], what: str) -> str:
    """A call item's tool name as the model sampled it: a ``namespace`` joined on."""
    name = required_str(item, "name", what)
    namespace = optional_str(item, "namespace")
    return flat_tool_name(namespace, name) if namespace else name


class History:
    """Folds input items into chat messages: one assistant message per sampled turn."""

    def __init__(self) -> None:
        self.system: list[str] = []
        self.messages: list[Message] = []
        self.ignored: list[str] = []
        self._turn: Message | None = None
        self._rank = _REASONING
        self._tool_images: list[dict[str, Any]] = []

    def add(self, raw: Any) -> None:
        item = require_dict(raw, "each input item")
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"
        if kind in OUTPUT_ITEMS:
            self._close_turn()
            self._tool_output(item, kind)
            return
        self._flush_tool_images()
        if kind == "message":
            self._message(item)
        elif kind == "reasoning":
            self._reasoning(item)
        elif kind in CALL_ITEMS:
            self._call(item, kind)
        elif kind == "item_reference":
            raise _unknown_item(item)
        elif isinstance(kind, str) and kind in COMPACTION_ITEMS:
            raise InvalidRequest(
                f"input item type {kind!r} is not supported: {COMPACTION_ITEMS[kind]}. "
                + COMPACT_LOCALLY
            )
        elif isinstance(kind, str):
            # Hosted-tool calls, ...: nothing the engine can replay.
            self._close_turn()
            if kind not in self.ignored:
                self.ignored.append(kind)
        else:
            raise InvalidRequest("each input item needs a string 'type' or a 'role'")

    def finish(self) -> list[Message]:
        self._flush_tool_images()
        system = [s for s in self.system if s]
        if not system:
            return self.messages
        return [{"role": "system", "content": "\n\n".join(system)}, *self.messages]

    def _close_turn(self) -> None:
        self._turn = None

    def _open_turn(self, rank: int) -> Message:
        """The assistant message this item belongs to, starting a new one when it must."""
        turn = self._turn
        if turn is None or self._rank > rank or (rank == _CONTENT == self._rank):
            turn = {"role": "assistant", "content": ""}
            self.messages.append(turn)
            self._turn = turn
        self._rank = rank
        return turn

    def _message(self, item: Mapping[str, Any]) -> None:
        role = item.get("role")
        content = item.get("content")
        if role in ("system", "developer"):
            self._close_turn()
            self.system.append(_text_only(content, f"a {role} message"))
        elif role == "user":
            self._close_turn()
            self.messages.append({"role": "user", "content": chat_content(_parts(content))})
        elif role == "assistant":
            text = _text_only(content, "an assistant message")
            turn = self._open_turn(_CONTENT)
            turn["content"] = text
        else:
            raise InvalidRequest("message role must be user, assistant, system or developer")

    def _reasoning(self, item: Mapping[str, Any]) -> None:
        text = _reasoning_text(item)
        if not text:
            # Redacted or foreign reasoning: nothing to keep, but it still starts a turn.
            self._close_turn()
            return
        turn = self._open_turn(_REASONING)
        turn["reasoning"] = join_text([turn.get("reasoning", ""), text])

    def _call(self, item: Mapping[str, Any], kind: str) -> None:
        call = _history_call(item, kind)
        turn = self._open_turn(_CALLS)
        turn.setdefault("tool_calls", []).append(call)

    def _tool_output(self, item: Mapping[str, Any], kind: str) -> None:
        if kind == "local_shell_call_output" and not isinstance(item.get("call_id"), str):
            call_id = required_str(item, "id", "a local_shell_call_output")
        else:
            call_id = required_str(item, "call_id", f"a {kind}")
        texts: list[str] = []
        output = item.get("output")
        if isinstance(output, str):
            texts.append(output)
        else:
            for part in _parts(output):
                if part["type"] == "text":
                    texts.append(part["text"])
                elif part["type"] == "image_url":
                    self._tool_images.append(part)
                else:
                    raise InvalidRequest("tool outputs may only contain text and images")
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": join_text(texts)})

    def _flush_tool_images(self) -> None:
        """Chat tool messages carry text only, so images from tool outputs follow as a user turn."""
        if self._tool_images:
            self.messages.append({"role": "user", "content": self._tool_images})
            self._tool_images = []


def _unknown_item(item: Mapping[str, Any]) -> NotFound:
    """An ``item_reference``: the gateway keeps replies by response id, not items by item id,
    so no reference resolves; answered as the API answers an unknown item, never skipped."""
    item_id = required_str(item, "id", "an item_reference")
    return NotFound(
        f"Item with id '{item_id}' not found. This gateway resolves no item_reference: send "
        "the item itself, or continue a stored response with previous_response_id."
    )


def _history_call(item: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """A replayed call item as a chat tool call (ids kept verbatim)."""
    if kind == "function_call":
        call_id = required_str(item, "call_id", "a function_call")
        name = call_name(item, "a function_call")
        arguments = item.get("arguments")
        if arguments is not None and not isinstance(arguments, str | dict):
            raise InvalidRequest("function_call arguments must be a string")
        text = arguments_text(arguments)
    elif kind == "custom_tool_call":
        call_id = required_str(item, "call_id", "a custom_tool_call")
        name = call_name(item, "a custom_tool_call")
        text = orjson.dumps({"input": required_str(item, "input", "a custom_tool_call")}).decode()
    else:
        call_id = item.get("call_id") or required_str(item, "id", "a local_shell_call")
        if not isinstance(call_id, str):
            raise InvalidRequest("a local_shell_call needs a string 'call_id'")
        name = LOCAL_SHELL
        text = orjson.dumps(_shell_arguments(item.get("action"))).decode()
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def _shell_arguments(action: Any) -> dict[str, Any]:
    """A local_shell action as the arguments of our ``local_shell`` function."""
    action = require_dict(action, "local_shell_call action")
    command = action.get("command")
    if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
        raise InvalidRequest("local_shell_call action.command must be an array of strings")
    arguments: dict[str, Any] = {"command": command}
    workdir = optional_str(action, "working_directory")
    if workdir is not None:
        arguments["workdir"] = workdir
    timeout = optional_number(action, "timeout_ms", int)
    if timeout is not None:
        arguments["timeout_ms"] = timeout
    return arguments


def _reasoning_text(item: Mapping[str, Any]) -> str:
    """Our own blob gives the exact text back; otherwise raw reasoning, else the summary."""
    decoded = decode_reasoning(optional_str(item, "encrypted_content"))
    if decoded is not None:
        return decoded
    content = [
        required_str(require_dict(p, "reasoning content"), "text", "reasoning content")
        for p in require_list(item.get("content"), "reasoning content")
    ]
    if any(content):
        return join_text(content)
    summary = [
        required_str(require_dict(p, "reasoning summary"), "text", "reasoning summary")
        for p in require_list(item.get("summary"), "reasoning summary")
    ]
    return join_text(summary)


def _parts(content: Any) -> list[dict[str, Any]]:
    """Responses content (a string or typed parts) as chat content parts."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts: list[dict[str, Any]] = []
    for raw in require_list(content, "message content"):
        part = require_dict(raw, "each content part")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": required_str(part, "text", f"a {kind} part")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": required_str(part, "refusal", "a refusal")})
        elif kind == "input_image":
            image = _inline(part, ("image_url", "url"), "detail", "input_image needs an image_url")
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            file = _inline(
                part, ("file_data", "file_data"), "filename", "input_file needs file_data"
            )
            parts.append({"type": "file", "file": file})
        else:
            raise InvalidRequest(f"unsupported content part type {kind!r}")
    return parts


def _inline(
    part: dict[str, Any], source: tuple[str, str], optional: str, needs: str
) -> dict[str, Any]:
    """An inline image or file part in Chat Completions' shape: ``part[source[0]]`` (a
    non-empty string, else ``needs``: file ids are not supported) as ``source[1]``, and
    ``optional`` where it is a string."""
    value = part.get(source[0])
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{needs} (file ids are not supported)")
    inline: dict[str, Any] = {source[1]: value}
    if isinstance(part.get(optional), str):
        inline[optional] = part[optional]
    return inline


def _text_only(content: Any, what: str) -> str:
    parts = _parts(content)
    if any(p["type"] != "text" for p in parts):
        raise InvalidRequest(f"{what} may only contain text")
    return join_text([p["text"] for p in parts])
