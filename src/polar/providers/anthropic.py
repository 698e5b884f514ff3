"""Anthropic Messages API (``POST .../v1/messages``), the wire API Claude Code speaks.

Request quirks handled here and nowhere else:

* ``system`` (a string or text blocks) and ``role: "system"`` messages inside ``messages`` are
  merged, in order, into one leading system message. Lines starting with
  ``x-anthropic-billing-header:`` are removed from system text: Claude Code puts one there that
  changes on every call, which would break prefix merging. Removed lines go to
  ``capture.stripped``.
* A user turn holding ``tool_result`` blocks becomes one ``role: tool`` message per result (in
  order), then a user message with the turn's other blocks. Tool-result content lists are
  flattened to text; a result with ``is_error: true`` is prefixed with ``"Error: "``. Images inside
  a tool result cannot ride in a chat tool message, so they move to that trailing user message.
* ``thinking`` blocks become the assistant's ``reasoning``: the text inside our own synthetic
  ``signature`` when it decodes, else the block's ``thinking`` text. ``redacted_thinking`` and
  server-tool blocks in history are dropped (noted in ``capture.notes``).
* Anthropic-schema client tools (``bash_*``, ``text_editor_*``) become function tools with the
  documented input schemas under the client's ``name``; server tools (any other non-custom
  ``type``) are a 400 naming them: only Anthropic's service can run them.
* A final assistant message is a prefill: the engine continues it and the reply is only the
  continuation. Text documents become user text; PDF documents are a 400 naming them.
  ``disable_parallel_tool_use`` travels as ``parallel_tool_calls: false``.
* ``thinking`` (enabled / adaptive / disabled) is the reasoning switch and
  ``output_config.effort`` its effort (:mod:`polar.providers.reasoning`); ``display: omitted``
  answers thinking blocks with an empty text and the signature (which still carries the
  reasoning back, so history stays exact, and the record keeps it whole).
* ``context_management``: ``clear_thinking_20251015`` is applied to the history before
  rendering (the prompt changes, so a spliced trace is rendered whole where it did); the other
  edits (``clear_tool_uses_20250919``, ...) need the prompt's token count, which the adapter
  does not have: a 400 naming them. ``defer_loading`` tools are declared up front: there is no
  tool search here (its tools are server tools, refused by name).
* ``cache_control``, ``metadata`` and citations are ignored.

Replies: a ``thinking`` block (signed with :func:`encode_reasoning`) when the completion has
reasoning, a text block when it has text, one ``tool_use`` block per call. A completion with none
of these still gets one empty text block, so the assistant turn exists in the client's history
and the stream brackets a block as clients expect. A reply that a stop sequence ended reports
``stop_reason: stop_sequence`` with the matched string, as the API does.

The module reads better whole (about 690 lines): every quirk above is one Messages API's, and
its request blocks, reply blocks and stream events refer to each other; split, a reader would
chase one API's rules over several files (the LiteLLM lesson, in reverse).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from polar.errors import GatewayError, InvalidRequest
from polar.providers.base import (
    COUNT_TOKENS,
    GENERATE,
    Provider,
    RequestContext,
    arguments_object,
    arguments_text,
    chat_content,
    join_text,
    new_id,
    optional_number,
    require_dict,
    require_list,
    sse,
    stop_list,
)
from polar.providers.reasoning import (
    ANTHROPIC_EFFORTS,
    effort,
    effort_word,
    record_budget,
)
from polar.providers.reasoning_codec import decode_reasoning, encode_reasoning
from polar.providers.routing import ProviderRouting
from polar.providers.types import (
    CaptureTags,
    Completion,
    Message,
    NormalizedRequest,
    ReasoningControls,
    ReasoningEffort,
    ReasoningSwitch,
    ResponseFormat,
    SamplingParams,
    Tool,
)

BILLING_HEADER = "x-anthropic-billing-header:"

_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}

_STOP_REASONS = {"length": "max_tokens", "content_filter": "refusal"}

# The input schemas Anthropic documents for its client-side schema tools (the model is trained
# on them; the client runs them), keyed by tool type without its date suffix.
_EDIT_COMMANDS = {"type": "string", "enum": ["view", "create", "str_replace", "insert"]}
_UNDO_COMMANDS = {"type": "string", "enum": [*_EDIT_COMMANDS["enum"], "undo_edit"]}
_SCHEMA_TOOLS: dict[str, dict[str, Any]] = {
    "bash": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "restart": {"type": "boolean"}},
    },
    "text_editor": {
        "type": "object",
        "properties": {
            "command": _EDIT_COMMANDS,
            "path": {"type": "string"},
            "file_text": {"type": "string"},
            "old_str": {"type": "string"},
            "new_str": {"type": "string"},
            "insert_line": {"type": "integer"},
            "view_range": {"type": "array", "items": {"type": "integer"}},
        },
        "required": ["command", "path"],
    },
}

# Block types only the Messages API uses; a body carrying one is Anthropic-shaped.
_ANTHROPIC_BLOCKS = frozenset(
    {"tool_use", "tool_result", "image", "document", "thinking", "redacted_thinking"}
)

_PING = sse({"type": "ping"}, "ping")
_ERROR_TYPES_BY_KIND = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "not_found": "not_found_error",
    "request_too_large": "request_too_large",
    "rate_limit": "rate_limit_error",
    "overloaded": "overloaded_error",
    "timeout": "timeout_error",
}

_ERROR_TYPES_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class AnthropicProvider(Provider):
    """Anthropic Messages: ``/messages`` and ``/messages/count_tokens``."""

    name: ClassVar[str] = "anthropic"
    routing: ClassVar[ProviderRouting] = ProviderRouting(
        client="anthropic",
        api_roots=("/v1",),
        key_headers=("x-api-key",),
        base_url_env=("ANTHROPIC_BASE_URL",),
        api_key_env=("ANTHROPIC_API_KEY",),
    )

    def operation(self, ctx: RequestContext) -> str | None:
        if ctx.method.upper() != "POST":
            return None
        path = ctx.path.partition("?")[0].rstrip("/")
        if path.endswith("/messages/count_tokens"):
            return COUNT_TOKENS
        if path.endswith("/messages"):
            return GENERATE
        return None

    def matches_headers(self, headers: Mapping[str, str]) -> bool:
        return "anthropic-version" in headers

    def matches_body(self, body: Any) -> bool:
        if not isinstance(body, dict) or "max_tokens" not in body:
            return False
        messages = body.get("messages")
        if not isinstance(messages, list):
            return False
        if "system" in body or "stop_sequences" in body or "thinking" in body:
            return True
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list) and any(
                isinstance(block, dict) and block.get("type") in _ANTHROPIC_BLOCKS
                for block in content
            ):
                return True
        return False

    def parse_request(self, body: Any, ctx: RequestContext) -> NormalizedRequest:
        body = require_dict(body)
        model = body.get("model", "")
        if not isinstance(model, str):
            raise InvalidRequest("model must be a string")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise InvalidRequest("stream must be a boolean")
        if body.get("messages") is None:
            raise InvalidRequest("messages is required")

        capture = CaptureTags()
        conversion = _Conversion(capture)
        if body.get("system") is not None:
            conversion.add_system(body["system"], "system")
        history: list[Message] = []
        messages = require_list(body["messages"], "messages")
        if not messages:
            raise InvalidRequest("messages: at least one message is required")
        for index, message in enumerate(messages):
            history.extend(conversion.message(message, f"messages[{index}]"))
        _context_management(body.get("context_management"), history, capture)

        tools = _tools(body.get("tools"), capture)
        tool_choice = _tool_choice(body.get("tool_choice"))
        parallel = _parallel_tool_calls(body.get("tool_choice"), bool(tools), capture)
        prefill = bool(history) and history[-1]["role"] == "assistant"
        if prefill:
            _check_prefill(history[-1])
            capture.feature("assistant prefill", "honoured")

        system = join_text(conversion.system)
        messages = [{"role": "system", "content": system}] if system else []
        messages.extend(history)

        switch, omit = _thinking(body.get("thinking"), capture)
        return NormalizedRequest(
            provider=self.name,
            model=model,
            messages=messages,
            tools=tools,
            tool_choice=tool_choice if tools else None,
            params=_sampling(body),
            stream=stream,
            requested_model=model,
            capture=capture,
            response_format=_output_format(body, capture),
            continue_final=prefill,
            parallel_tool_calls=parallel,
            reasoning=ReasoningControls(switch=switch, effort=_effort(body)),
            adapter_state=AnthropicState(omit_thinking=omit),
        )

    def render_response(self, completion: Completion, request: NormalizedRequest) -> dict[str, Any]:
        blocks = _content_blocks(completion, _state(request))
        return _message(completion, request, blocks, _stop_reason(completion))

    def render_stream(self, completion: Completion, request: NormalizedRequest) -> list[bytes]:
        start = _message(completion, request, [], None)
        start["usage"]["output_tokens"] = 0
        frames = [
            sse({"type": "message_start", "message": start}, "message_start"),
            sse({"type": "ping"}, "ping"),
        ]
        for index, block in enumerate(_content_blocks(completion, _state(request))):
            opening, deltas = _block_events(block)
            frames.append(
                sse(
                    {"type": "content_block_start", "index": index, "content_block": opening},
                    "content_block_start",
                )
            )
            frames.extend(
                sse(
                    {"type": "content_block_delta", "index": index, "delta": delta},
                    "content_block_delta",
                )
                for delta in deltas
            )
            frames.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        frames.append(
            sse(
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": _stop_reason(completion),
                        "stop_sequence": (
                            completion.stop_sequence
                            if _stop_reason(completion) == "stop_sequence"
                            else None
                        ),
                    },
                    "usage": _usage(completion),
                },
                "message_delta",
            )
        )
        frames.append(sse({"type": "message_stop"}, "message_stop"))
        return frames

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        kind = _ERROR_TYPES_BY_KIND.get(error.kind) or _ERROR_TYPES_BY_STATUS.get(
            error.status, "api_error"
        )
        return {"type": "error", "error": {"type": kind, "message": error.message}}

    def stream_error(self, error: GatewayError) -> bytes:
        return sse(self.error_body(error), "error")

    def keep_alive(self) -> bytes:
        return _PING

    def render_token_count(self, count: int) -> dict[str, Any]:
        return {"input_tokens": count}


@dataclass
class AnthropicState:
    """What this adapter remembers between parsing a request and rendering its reply."""

    # thinking.display "omitted": thinking blocks carry only their signature.
    omit_thinking: bool = False


def _state(request: NormalizedRequest) -> AnthropicState:
    state = request.adapter_state
    return state if isinstance(state, AnthropicState) else AnthropicState()


@dataclass
class _Conversion:
    """Accumulates what one request's messages contribute beyond the chat history itself."""

    capture: CaptureTags
    system: list[str] = field(default_factory=list)

    def add_system(self, value: Any, where: str) -> None:
        for block in _blocks(value, where):
            if block["type"] != "text":
                raise InvalidRequest(f"{where} may only hold text blocks")
            self.system.append(self._strip_billing(_string(block.get("text"), f"{where} text")))

    def _strip_billing(self, text: str) -> str:
        if BILLING_HEADER not in text:
            return text
        kept = []
        for line in text.split("\n"):
            if line.startswith(BILLING_HEADER):
                self.capture.stripped.append(line)
            else:
                kept.append(line)
        return "\n".join(kept)

    def message(self, raw: Any, where: str) -> list[Message]:
        message = require_dict(raw, where)
        role = message.get("role")
        if role == "system":
            self.add_system(message.get("content"), where)
            return []
        blocks = _blocks(message.get("content"), f"{where}.content")
        if role == "user":
            return self._user(blocks, where)
        if role == "assistant":
            return [self._assistant(blocks, where)]
        raise InvalidRequest(f"{where}.role must be user, assistant or system")

    def _user(self, blocks: list[dict[str, Any]], where: str) -> list[Message]:
        results: list[Message] = []
        moved: list[dict[str, Any]] = []
        parts: list[dict[str, Any]] = []
        for index, block in enumerate(blocks):
            at = f"{where}.content[{index}]"
            if block["type"] == "tool_result":
                results.append(self._tool_result(block, at, moved))
                continue
            part = self._user_part(block, at)
            if part is not None:
                parts.append(part)
        parts = moved + parts
        if parts or not results:
            results.append({"role": "user", "content": chat_content(parts)})
        return results

    def _user_part(self, block: dict[str, Any], where: str) -> dict[str, Any] | None:
        kind = block["type"]
        if kind == "image":
            url = self._image_url(block, where)
            return None if url is None else {"type": "image_url", "image_url": {"url": url}}
        text = self._text_of(block, where)
        return None if text is None else {"type": "text", "text": text}

    def _text_of(self, block: dict[str, Any], where: str) -> str | None:
        """The text a text-like block carries; ``None`` (noted) for blocks we cannot pass on."""
        kind = block["type"]
        if kind == "text":
            return _string(block.get("text"), f"{where}.text")
        if kind == "document":
            return self._document_text(block, where)
        if kind == "search_result":
            return join_text(
                [_string(b.get("text"), f"{where} text") for b in _text_blocks(block, where)]
            )
        self.capture.notes.append(f"dropped {kind} block at {where}")
        return None

    def _document_text(self, block: dict[str, Any], where: str) -> str:
        """A plain-text document's text (with its title, as the model would see it named);
        PDF and file documents need a reader the gateway does not have: a 400 naming them."""
        source = require_dict(block.get("source"), f"{where}.source")
        kind = source.get("type")
        if kind == "text":
            text = _string(source.get("data"), f"{where}.source.data")
        elif kind == "content":
            pieces = []
            for index, part in enumerate(_blocks(source.get("content"), f"{where}.source")):
                if part["type"] != "text":
                    raise InvalidRequest(
                        f"{where}.source.content[{index}]: documents may only hold text here, "
                        f"not {part['type']} blocks"
                    )
                pieces.append(_string(part.get("text"), f"{where}.source[{index}].text"))
            text = join_text(pieces)
        elif kind in ("base64", "url"):
            self.capture.feature("PDF documents", "refused")
            raise InvalidRequest(
                f"{where}: PDF documents are not supported by this gateway; send the text as a "
                "text document or text block"
            )
        else:
            raise InvalidRequest(f"{where}: documents with a {kind!r} source are not supported")
        self.capture.feature("text documents", "mapped")
        title = block.get("title")
        return f"{title}\n\n{text}" if isinstance(title, str) and title else text

    def _image_url(self, block: dict[str, Any], where: str) -> str | None:
        source = require_dict(block.get("source"), f"{where}.source")
        kind = source.get("type")
        if kind == "base64":
            media = _string(source.get("media_type"), f"{where}.source.media_type")
            data = _string(source.get("data"), f"{where}.source.data")
            return f"data:{media};base64,{data}"
        if kind == "url":
            return _string(source.get("url"), f"{where}.source.url")
        self.capture.feature("image file sources", "refused")
        raise InvalidRequest(
            f"{where}: images with a {kind!r} source (the Files API) are not supported by this "
            "gateway; send the image as base64 or a url"
        )

    def _tool_result(
        self, block: dict[str, Any], where: str, moved: list[dict[str, Any]]
    ) -> Message:
        call_id = _string(block.get("tool_use_id"), f"{where}.tool_use_id")
        is_error = block.get("is_error", False)
        if not isinstance(is_error, bool):
            raise InvalidRequest(f"{where}.is_error must be a boolean")
        texts: list[str] = []
        content = block.get("content")
        if content is not None:
            for index, part in enumerate(_blocks(content, f"{where}.content")):
                at = f"{where}.content[{index}]"
                if part["type"] == "image":
                    url = self._image_url(part, at)
                    if url is not None:
                        moved.append({"type": "image_url", "image_url": {"url": url}})
                    continue
                text = self._text_of(part, at)
                if text is not None:
                    texts.append(text)
        text = join_text(texts)
        if is_error:
            text = f"Error: {text}" if text else "Error"
        return {"role": "tool", "tool_call_id": call_id, "content": text}

    def _assistant(self, blocks: list[dict[str, Any]], where: str) -> Message:
        texts: list[str] = []
        reasoning: list[str] = []
        calls: list[dict[str, Any]] = []
        for index, block in enumerate(blocks):
            at = f"{where}.content[{index}]"
            kind = block["type"]
            if kind == "text":
                texts.append(_string(block.get("text"), f"{at}.text"))
            elif kind == "tool_use":
                calls.append(_tool_call(block, at))
            elif kind == "thinking":
                reasoning.append(_thinking_text(block, at))
            else:
                self.capture.notes.append(f"dropped {kind} block at {at}")
        message: Message = {"role": "assistant", "content": join_text(texts)}
        if calls:
            message["tool_calls"] = calls
        thought = join_text(reasoning)
        if thought:
            message["reasoning"] = thought
        return message


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{what} must be a string")
    return value


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """Message content as typed blocks; a plain string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise InvalidRequest(f"{where} must be a string or an array of content blocks")
    blocks = []
    for index, block in enumerate(content):
        block = require_dict(block, f"{where}[{index}]")
        if not isinstance(block.get("type"), str):
            raise InvalidRequest(f"{where}[{index}].type must be a string")
        blocks.append(block)
    return blocks


def _text_blocks(block: dict[str, Any], where: str) -> list[dict[str, Any]]:
    return [b for b in _blocks(block.get("content"), f"{where}.content") if b["type"] == "text"]


def _tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    arguments = block.get("input")
    if arguments is not None and not isinstance(arguments, dict):
        raise InvalidRequest(f"{where}.input must be an object")
    try:
        text = arguments_text(arguments)
    except orjson.JSONEncodeError as exc:
        raise InvalidRequest(f"{where}.input cannot be encoded: {exc}") from exc
    return {
        "id": _string(block.get("id"), f"{where}.id"),
        "type": "function",
        "function": {"name": _string(block.get("name"), f"{where}.name"), "arguments": text},
    }


def _thinking_text(block: dict[str, Any], where: str) -> str:
    """Our own signature carries the exact sampled reasoning; otherwise trust the text."""
    signature = block.get("signature")
    decoded = decode_reasoning(signature) if isinstance(signature, str) else None
    if decoded is not None:
        return decoded
    thinking = block.get("thinking", "")
    return _string(thinking, f"{where}.thinking")


def _tools(raw: Any, capture: CaptureTags) -> list[Tool]:
    tools: list[Tool] = []
    for index, tool in enumerate(require_list(raw, "tools")):
        tool = require_dict(tool, f"tools[{index}]")
        kind = tool.get("type")
        if kind is not None and kind != "custom":
            tools.append(_schema_tool(_string(kind, f"tools[{index}].type"), tool, index, capture))
            continue
        function: dict[str, Any] = {"name": _string(tool.get("name"), f"tools[{index}].name")}
        if tool.get("description") is not None:
            function["description"] = _string(tool["description"], f"tools[{index}].description")
        _defer_loading(tool, index, function["name"], capture)
        schema = tool.get("input_schema")
        function["parameters"] = (
            {"type": "object", "properties": {}}
            if schema is None
            else require_dict(schema, f"tools[{index}].input_schema")
        )
        tools.append({"type": "function", "function": function})
    return tools


def _schema_tool(kind: str, tool: dict[str, Any], index: int, capture: CaptureTags) -> Tool:
    """An Anthropic-schema client tool as the function tool it stands for; the model calls it
    under the client's ``name``. Server tools (web search, code execution, ...) run inside
    Anthropic's service: nothing here can run them, so they are refused, not dropped."""
    base, _, version = kind.rpartition("_")
    schema = _SCHEMA_TOOLS.get(base) if version.isdigit() else None
    if schema is None:
        capture.feature(f"tool {kind}", "refused")
        raise InvalidRequest(
            f"tools[{index}]: the server tool {kind!r} runs inside Anthropic's service and is "
            "not available here; declare a custom tool instead"
        )
    if kind == "text_editor_20250124":  # the only version with undo_edit
        schema = {**schema, "properties": {**schema["properties"], "command": _UNDO_COMMANDS}}
    name = _string(tool.get("name"), f"tools[{index}].name")
    capture.feature(f"tool {kind}", "mapped")
    return {"type": "function", "function": {"name": name, "parameters": schema}}


def _tool_choice(raw: Any) -> Any:
    if raw is None:
        return None
    choice = require_dict(raw, "tool_choice")
    kind = choice.get("type")
    if kind == "tool":
        name = _string(choice.get("name"), "tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    if isinstance(kind, str) and kind in _TOOL_CHOICES:
        return _TOOL_CHOICES[kind]
    raise InvalidRequest("tool_choice.type must be auto, any, tool or none")


def _parallel_tool_calls(raw: Any, has_tools: bool, capture: CaptureTags) -> bool | None:
    """``tool_choice.disable_parallel_tool_use``: at most one tool call, forwarded as
    ``parallel_tool_calls: false``."""
    if not isinstance(raw, dict) or raw.get("disable_parallel_tool_use") is None:
        return None
    disable = raw["disable_parallel_tool_use"]
    if not isinstance(disable, bool):
        raise InvalidRequest("tool_choice.disable_parallel_tool_use must be a boolean")
    if not disable or not has_tools:
        return None
    capture.feature("disable_parallel_tool_use", "mapped")
    return False


def _check_prefill(message: Message) -> None:
    """A final assistant turn is a prefill the model continues; the API's own rules for it."""
    if message.get("tool_calls"):
        raise InvalidRequest(
            "assistant prefill: the final assistant message may not hold tool_use blocks"
        )
    content = message.get("content")
    if isinstance(content, str) and content != content.rstrip():
        raise InvalidRequest("final assistant content cannot end with trailing whitespace")


def _output_format(body: Mapping[str, Any], capture: CaptureTags) -> ResponseFormat | None:
    """``output_config.format`` (or the beta's top-level ``output_format``): a ``json_schema``
    with ``schema``, mapped to the engine's response_format."""
    config = body.get("output_config")
    spec = require_dict(config, "output_config").get("format") if config is not None else None
    if spec is None:
        spec = body.get("output_format")
    if spec is None:
        return None
    spec = require_dict(spec, "output_config.format")
    if spec.get("type") != "json_schema":
        raise InvalidRequest(
            f"structured output: output_config.format type {spec.get('type')!r} is not "
            "supported (json_schema)"
        )
    capture.feature("structured_output", "mapped")
    return ResponseFormat(
        "json_schema", schema=require_dict(spec.get("schema"), "output_config.format.schema")
    )


def _thinking(raw: Any, capture: CaptureTags) -> tuple[ReasoningSwitch | None, bool]:
    """``thinking``: the reasoning switch (on for enabled and adaptive), and whether the reply
    omits the reasoning text (``display: omitted``); a budget is recorded by name."""
    if raw is None:
        return None, False
    spec = require_dict(raw, "thinking")
    kind = _string(spec.get("type"), "thinking.type")
    if kind not in ("enabled", "adaptive", "disabled"):
        raise InvalidRequest("thinking.type must be enabled, adaptive or disabled")
    budget = optional_number(spec, "budget_tokens", int)
    if budget is not None:
        if budget < 1:
            raise InvalidRequest("thinking.budget_tokens must be at least 1")
        record_budget(capture, "thinking.budget_tokens", budget)
    display = spec.get("display")
    if display not in (None, "summarized", "omitted"):
        raise InvalidRequest("thinking.display must be summarized or omitted")
    if display == "omitted":
        capture.feature("thinking display omitted", "honoured")
    elif display == "summarized":
        capture.feature("thinking display summarized", "mapped")
        capture.notes.append(
            "thinking display summarized: the reasoning comes back whole, as sampled"
        )
    return ReasoningSwitch(f"thinking {kind}", on=kind != "disabled"), display == "omitted"


def _effort(body: Mapping[str, Any]) -> ReasoningEffort | None:
    """``output_config.effort``: how hard the model works, on a template's effort levels."""
    config = body.get("output_config")
    if config is None:
        return None
    value = require_dict(config, "output_config").get("effort")
    word = effort_word(value, "output_config.effort", ANTHROPIC_EFFORTS)
    return None if word is None else effort("output_config.effort", word)


def _defer_loading(tool: dict[str, Any], index: int, name: str, capture: CaptureTags) -> None:
    """A deferred tool waits for a tool search, which only Anthropic's service runs (its tools
    are refused as server tools): here it is declared up front, on the record by name."""
    defer = tool.get("defer_loading")
    if defer is None:
        return
    if not isinstance(defer, bool):
        raise InvalidRequest(f"tools[{index}].defer_loading must be a boolean")
    if defer:
        capture.feature("defer_loading", "mapped")
        capture.notes.append(
            f"defer_loading: tool {name!r} is declared up front (no tool search here)"
        )


_CLEAR_THINKING = "clear_thinking_20251015"


def _context_management(raw: Any, history: list[Message], capture: CaptureTags) -> None:
    """``context_management.edits``: ``clear_thinking_20251015`` is applied to ``history``;
    an edit that needs the prompt's token count (clearing tool uses, compaction) is refused by
    name rather than ignored."""
    if raw is None:
        return
    spec = require_dict(raw, "context_management")
    for index, edit in enumerate(require_list(spec.get("edits"), "context_management.edits")):
        where = f"context_management.edits[{index}]"
        edit = require_dict(edit, where)
        kind = _string(edit.get("type"), f"{where}.type")
        feature = f"context_management {kind}"
        if kind != _CLEAR_THINKING:
            capture.feature(feature, "refused")
            raise InvalidRequest(
                f"{where}: the {kind!r} context edit is not supported by this gateway (it "
                "clears by the prompt's token count, which is known only once rendered); "
                f"clear old tool results in the client, or send only {_CLEAR_THINKING}"
            )
        cleared = _clear_thinking(edit.get("keep"), history, where)
        capture.feature(feature, "honoured")
        if cleared:
            capture.notes.append(
                f"{feature}: cleared the reasoning of {cleared} earlier assistant turn(s)"
            )


def _clear_thinking(keep: Any, history: list[Message], where: str) -> int:
    """Drop the reasoning of every assistant turn but the last ``keep`` that have some (the
    API's default: one); ``keep: "all"`` keeps it all. Returns how many were cleared."""
    if keep == "all":
        return 0
    turns = 1
    if keep is not None:
        spec = require_dict(keep, f"{where}.keep")
        if spec.get("type") != "thinking_turns":
            raise InvalidRequest(f'{where}.keep must be "all" or a thinking_turns object')
        turns = optional_number(spec, "value", int) or 0
        if turns < 1:
            raise InvalidRequest(f"{where}.keep.value must be at least 1")
    thinking = [m for m in history if m.get("role") == "assistant" and m.get("reasoning")]
    cleared = thinking[:-turns] if len(thinking) > turns else []
    for message in cleared:
        del message["reasoning"]
    return len(cleared)


def _sampling(body: dict[str, Any]) -> SamplingParams:
    return SamplingParams(
        max_tokens=optional_number(body, "max_tokens", int),
        temperature=optional_number(body, "temperature"),
        top_p=optional_number(body, "top_p"),
        top_k=optional_number(body, "top_k", int),
        stop=stop_list(body.get("stop_sequences")),
    )


def _content_blocks(completion: Completion, state: AnthropicState) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if completion.reasoning:
        blocks.append(
            {
                "type": "thinking",
                "thinking": "" if state.omit_thinking else completion.reasoning,
                "signature": encode_reasoning(completion.reasoning),
            }
        )
    if completion.content or not (completion.reasoning or completion.tool_calls):
        blocks.append({"type": "text", "text": completion.content})
    blocks.extend(
        {
            "type": "tool_use",
            "id": call.id or new_id("toolu_"),
            "name": call.name,
            "input": arguments_object(call.arguments),
        }
        for call in completion.tool_calls
    )
    return blocks


def _block_events(block: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A block's ``content_block_start`` payload and its deltas, each delta complete."""
    kind = block["type"]
    if kind == "thinking":
        text = [{"type": "thinking_delta", "thinking": block["thinking"]}]
        return {"type": "thinking", "thinking": "", "signature": ""}, [
            *(text if block["thinking"] else []),
            {"type": "signature_delta", "signature": block["signature"]},
        ]
    if kind == "tool_use":
        partial = orjson.dumps(block["input"]).decode()
        return {**block, "input": {}}, [{"type": "input_json_delta", "partial_json": partial}]
    text = block["text"]
    return {"type": "text", "text": ""}, [{"type": "text_delta", "text": text}] if text else []


def _message(
    completion: Completion,
    request: NormalizedRequest,
    content: list[dict[str, Any]],
    stop_reason: str | None,
) -> dict[str, Any]:
    message_id = completion.id if completion.id.startswith("msg_") else None
    if message_id is None:
        message_id = f"msg_{completion.id}" if completion.id else new_id("msg_")
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": request.requested_model or request.model or completion.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": completion.stop_sequence if stop_reason == "stop_sequence" else None,
        "usage": _usage(completion),
    }


def _stop_reason(completion: Completion) -> str:
    if completion.finish_reason in _STOP_REASONS:
        return _STOP_REASONS[completion.finish_reason]
    if completion.tool_calls:
        return "tool_use"
    return "stop_sequence" if completion.stop_sequence else "end_turn"


def _usage(completion: Completion) -> dict[str, int]:
    return {
        "input_tokens": completion.prompt_tokens,
        "output_tokens": completion.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
