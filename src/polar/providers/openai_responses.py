"""OpenAI Responses API (``POST .../responses``), the wire API Codex CLI speaks.

Requests are lists of typed items rather than chat messages. The one conversion that matters
most for training is grouping: a sampled turn comes back as a ``reasoning`` item, an assistant
``message`` item and ``function_call`` items, and all of them must fold into ONE chat assistant
message (reasoning, content and every tool call, in order). Splitting them, or hanging the
reasoning on the wrong message, changes the re-rendered prompt and breaks prefix merging.

Codex's non-function tools are mapped to plain functions the engine can call: a ``custom``
(freeform) tool becomes a function taking one string ``input``, ``local_shell`` a function with
a command array. Calls to them are rendered back as ``custom_tool_call`` / ``local_shell_call``
items so the harness runs them as it expects. Hosted tools (web search, file search, ...) are
dropped: the engine cannot run them.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from polar.errors import GatewayError, InvalidRequest, NotFound
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
)
from polar.providers.logprobs import sampled_logprobs
from polar.providers.openai_chat import OPENAI_ROUTING
from polar.providers.openai_errors import openai_error_body
from polar.providers.reasoning_codec import decode_reasoning, encode_reasoning
from polar.providers.routing import ProviderRouting
from polar.providers.stateful import RETRIEVE, StatefulReplies
from polar.providers.types import (
    CaptureTags,
    Completion,
    Message,
    NormalizedRequest,
    ResponseFormat,
    SamplingParams,
    Tool,
    ToolCall,
)

LOCAL_SHELL = "local_shell"

_LOCAL_SHELL_TOOL: Tool = {
    "type": "function",
    "function": {
        "name": LOCAL_SHELL,
        "description": "Runs a shell command on the user's machine and returns its output.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "The command and its arguments, as for execvp.",
                },
                "workdir": {"type": "string", "description": "Working directory."},
                "timeout_ms": {"type": "integer", "description": "Timeout in milliseconds."},
            },
            "required": ["command"],
        },
    },
}

_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}

# Items that are sampled by the model, in the order one turn emits them. A new assistant
# message starts when an item's rank is below the open turn's (reasoning after a call), or when
# a second text message arrives; consecutive calls always join the open turn.
_REASONING, _CONTENT, _CALLS = 0, 1, 2

_CALL_ITEMS = ("function_call", "custom_tool_call", "local_shell_call")
_OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")

_CONVERSATION_REFUSED = (
    "conversation is not supported by this gateway; use previous_response_id to continue a "
    "stored response"
)


@dataclass
class ResponsesState:
    """What this adapter remembers between parsing a request and rendering its reply."""

    custom_tools: list[str] = field(default_factory=list)  # calls to these are custom_tool_call
    local_shell: bool = False  # a local_shell tool was declared: its calls are local_shell_call
    echo: dict[str, Any] = field(default_factory=dict)  # request fields the Response repeats
    previous_response_id: str | None = None  # the stored response this call continues
    store: bool = True  # keep the Response for retrieval and continuation (the API's default)
    instructions: str | None = None  # leads the system message; never carried to a next call


def _state(request: NormalizedRequest) -> ResponsesState:
    state = request.adapter_state
    return state if isinstance(state, ResponsesState) else ResponsesState()


class OpenAIResponsesProvider(Provider, StatefulReplies):
    """Adapter for ``POST /v1/responses``, ``POST /v1/responses/input_tokens`` and
    ``GET``/``DELETE /v1/responses/{id}`` (responses stored per session)."""

    name = "openai_responses"
    routing: ClassVar[ProviderRouting] = OPENAI_ROUTING

    def operation(self, ctx: RequestContext) -> str | None:
        path = ctx.path.rstrip("/")
        if ctx.method.upper() in ("GET", "DELETE"):
            head, _, reply_id = path.rpartition("/")
            if head.endswith("/responses") and reply_id and reply_id != "input_tokens":
                return RETRIEVE
            return None
        if ctx.method.upper() != "POST":
            return None
        if path.endswith("/responses/input_tokens"):
            return COUNT_TOKENS
        if path.endswith("/responses"):
            return GENERATE
        return None

    def matches_body(self, body: Any) -> bool:
        return (
            isinstance(body, dict)
            and isinstance(body.get("input"), str | list)
            and "messages" not in body
        )

    def parse_request(self, body: Any, ctx: RequestContext) -> NormalizedRequest:
        body = require_dict(body)
        model = _optional_str(body, "model") or ""
        instructions = _optional_str(body, "instructions")
        tools = _convert_tools(body.get("tools"))

        history = _History()
        if instructions:
            history.system.append(instructions)
        raw_input = body.get("input")
        if raw_input is None or raw_input in ("", []):
            raise InvalidRequest("input is required and must not be empty")
        if isinstance(raw_input, str):
            history.messages.append({"role": "user", "content": raw_input})
        else:
            for item in require_list(raw_input, "input"):
                history.add(item)
        messages = history.finish()

        tool_choice = _convert_tool_choice(body.get("tool_choice"), tools.tools)
        if body.get("conversation") is not None:
            raise InvalidRequest(_CONVERSATION_REFUSED)
        previous = _optional_str(body, "previous_response_id")
        _check_accepted(body)
        state = ResponsesState(
            custom_tools=tools.custom,
            local_shell=tools.local_shell,
            echo=_echo_fields(body),
            previous_response_id=previous,
            store=body.get("store") is not False,
            instructions=instructions or None,
        )
        capture = CaptureTags(ignored_items=history.ignored)
        if previous:
            capture.feature("previous_response_id", "honoured")
        if state.store:
            capture.feature("store", "honoured")
        return NormalizedRequest(
            provider=self.name,
            model=model,
            messages=messages,
            tools=tools.tools,
            tool_choice=tool_choice if tools.tools else None,
            params=SamplingParams(
                max_tokens=optional_number(body, "max_output_tokens", int),
                temperature=optional_number(body, "temperature"),
                top_p=optional_number(body, "top_p"),
                top_k=optional_number(body, "top_k", int),
            ),
            stream=_optional_bool(body, "stream") or False,
            dropped_tools=tools.dropped,
            requested_model=model,
            capture=capture,
            adapter_state=state,
            response_format=_text_format(body.get("text"), capture),
            parallel_tool_calls=_parallel_tool_calls(body, bool(tools.tools), capture),
            logprobs=_logprobs_asked(body, capture),
        )

    def render_response(self, completion: Completion, request: NormalizedRequest) -> dict[str, Any]:
        return _response_object(completion, request, _output_items(completion, request))

    def render_stream(self, completion: Completion, request: NormalizedRequest) -> list[bytes]:
        items = _output_items(completion, request)
        events = _Events()
        opening = _response_object(completion, request, [], in_progress=True)
        events.emit("response.created", response=opening)
        events.emit("response.in_progress", response=opening)
        for index, item in enumerate(items):
            _stream_item(events, index, item)
        # Always response.completed, even for a length stop (whose status is "incomplete"):
        # Codex treats response.incomplete as a failed stream and retries the same request.
        events.emit("response.completed", response=_response_object(completion, request, items))
        return events.frames

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return openai_error_body(error)

    def stream_error(self, error: GatewayError) -> bytes:
        """An ``error`` event, then ``response.failed`` (what Codex reads).

        The error event carries the documented top-level ``code``/``message`` and, as the real
        API sends it, the error object under ``error``: the openai SDK raises APIError on that.
        """
        code = _failed_code(error)
        failed = {
            "id": new_id("resp_"),
            "object": "response",
            "created_at": int(time.time()),
            "status": "failed",
            "error": {"code": code, "message": error.message},
            "incomplete_details": None,
            "model": "",
            "output": [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": None,
        }
        error_event = {
            "type": "error",
            "code": code,
            "message": error.message,
            "param": None,
            "error": openai_error_body(error)["error"],
            "sequence_number": 0,
        }
        failed_event = {"type": "response.failed", "response": failed, "sequence_number": 1}
        return sse(error_event, event="error") + sse(failed_event, event="response.failed")

    def render_token_count(self, count: int) -> dict[str, Any]:
        return {"object": "response.input_tokens", "input_tokens": count}

    # -- stored responses (previous_response_id, GET/DELETE /responses/{id})

    def reply_id(self, ctx: RequestContext) -> str:
        return ctx.path.rstrip("/").rpartition("/")[2]

    def reply_to_store(
        self, completion: Completion, request: NormalizedRequest
    ) -> tuple[str, dict[str, Any]] | None:
        if not _state(request).store:
            return None
        reply = self.render_response(completion, request)
        return reply["id"], reply

    def continues(self, request: NormalizedRequest) -> str | None:
        return _state(request).previous_response_id

    def continue_after(
        self, request: NormalizedRequest, context: list[Message], stored: dict[str, Any]
    ) -> None:
        """The stored response's messages, then this call's. As in the real API the earlier
        ``instructions`` are not carried over (this call's own lead the system message), while
        system and developer input items are; the gateway keeps all of it in one leading system
        message, as for any request."""
        earlier = list(context)
        old_system = ""
        if earlier and earlier[0].get("role") == "system":
            old_system = _without_lead(
                earlier.pop(0).get("content") or "", stored.get("instructions")
            )
        own = list(request.messages)
        new_system = ""
        if own and own[0].get("role") == "system":
            new_system = _without_lead(
                own.pop(0).get("content") or "", _state(request).instructions
            )
        parts = (_state(request).instructions or "", old_system, new_system)
        system = "\n\n".join(part for part in parts if part)
        lead: list[Message] = [{"role": "system", "content": system}] if system else []
        request.messages = lead + earlier + own

    def deleted(self, reply_id: str) -> dict[str, Any]:
        return {"id": reply_id, "object": "response", "deleted": True}

    def not_found(self, reply_id: str, *, continued: bool) -> GatewayError:
        if continued:
            return InvalidRequest(f"Previous response with id '{reply_id}' not found.")
        return NotFound(f"Response with id '{reply_id}' not found.")


# --------------------------------------------------------------------------- request: fields


def _optional_str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"{key} must be a string")
    return value


def _optional_bool(body: Mapping[str, Any], key: str) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest(f"{key} must be a boolean")
    return value


def _required_str(item: Mapping[str, Any], key: str, what: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise InvalidRequest(f"{what} needs a string {key!r}")
    return value


def _parallel_tool_calls(
    body: Mapping[str, Any], has_tools: bool, capture: CaptureTags
) -> bool | None:
    """``parallel_tool_calls: false``: at most one function call, passed on to the engine."""
    if body.get("parallel_tool_calls") is not False or not has_tools:
        return None
    capture.feature("parallel_tool_calls", "honoured")
    return False


def _logprobs_asked(body: Mapping[str, Any], capture: CaptureTags) -> bool:
    include = body.get("include")
    return sampled_logprobs(
        isinstance(include, list) and "message.output_text.logprobs" in include,
        optional_number(body, "top_logprobs", int),
        capture,
        field="include",
        top_field="top_logprobs",
        instead="use include message.output_text.logprobs",
    )


def _check_accepted(body: Mapping[str, Any]) -> None:
    """Fields accepted and ignored still get their types checked, as the real API does."""
    _optional_bool(body, "store")
    _optional_bool(body, "parallel_tool_calls")
    if body.get("reasoning") is not None:
        require_dict(body["reasoning"], "reasoning")
    if body.get("metadata") is not None:
        require_dict(body["metadata"], "metadata")
    include = require_list(body.get("include"), "include")
    if not all(isinstance(v, str) for v in include):
        raise InvalidRequest("include must be an array of strings")


def _without_lead(system: str, instructions: Any) -> str:
    """A system message's text less the ``instructions`` it starts with (joined by a blank line,
    as :class:`_History` joins them)."""
    if not isinstance(instructions, str) or not instructions:
        return system
    if system == instructions:
        return ""
    return system.removeprefix(instructions + "\n\n")


def _echo_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """Request fields the Response object repeats back (sampling values come from params)."""
    echo: dict[str, Any] = {
        "instructions": body.get("instructions"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "store": body.get("store") is not False,
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
    }
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict):
        echo["reasoning"] = {
            k: reasoning.get(k) for k in ("effort", "summary") if isinstance(reasoning.get(k), str)
        }
    return echo


def _text_format(text: Any, capture: CaptureTags) -> ResponseFormat | None:
    """``text.format``: text (no constraint), json_object, or json_schema with ``name``,
    ``schema`` and ``strict`` beside ``type``; mapped to the engine's response_format."""
    if text is None:
        return None
    spec = require_dict(text, "text").get("format")
    if spec is None:
        return None
    spec = require_dict(spec, "text.format")
    kind = spec.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        result = ResponseFormat("json_object")
    elif kind == "json_schema":
        strict = spec.get("strict")
        result = ResponseFormat(
            "json_schema",
            schema=require_dict(spec.get("schema"), "text.format.schema"),
            name=str(spec.get("name") or "response"),
            strict=strict if isinstance(strict, bool) else None,
        )
    else:
        raise InvalidRequest(
            f"structured output: text.format type {kind!r} is not supported "
            "(text, json_object or json_schema)"
        )
    capture.feature("structured_output", "mapped")
    return result


# --------------------------------------------------------------------------- request: tools


@dataclass
class _Tools:
    tools: list[Tool] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    custom: list[str] = field(default_factory=list)
    local_shell: bool = False


def _convert_tools(raw: Any) -> _Tools:
    out = _Tools()
    for tool in require_list(raw, "tools"):
        tool = require_dict(tool, "each tool")
        kind = tool.get("type")
        if kind == "function":
            out.tools.append(_function_tool(tool))
        elif kind == "custom":
            out.tools.append(_custom_tool(tool))
            out.custom.append(tool["name"])
        elif kind == LOCAL_SHELL:
            out.tools.append(copy.deepcopy(_LOCAL_SHELL_TOOL))
            out.local_shell = True
        elif isinstance(kind, str):
            out.dropped.append(kind)
        else:
            raise InvalidRequest("each tool needs a string 'type'")
    return out


def _function_tool(tool: Mapping[str, Any]) -> Tool:
    name = _required_str(tool, "name", "a function tool")
    description = _optional_str(tool, "description")
    parameters = tool.get("parameters")
    if parameters is None:
        parameters = copy.deepcopy(_EMPTY_SCHEMA)
    parameters = require_dict(parameters, f"parameters of tool {name!r}")
    function: dict[str, Any] = {"name": name}
    if description:
        function["description"] = description
    function["parameters"] = parameters
    return {"type": "function", "function": function}


def _custom_tool(tool: Mapping[str, Any]) -> Tool:
    """A freeform tool as a function of one string; its grammar, if any, goes in the hint."""
    name = _required_str(tool, "name", "a custom tool")
    description = _optional_str(tool, "description")
    hint = "The raw input for this tool."
    fmt = tool.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        syntax = fmt.get("syntax") if isinstance(fmt.get("syntax"), str) else "grammar"
        definition = fmt.get("definition")
        if isinstance(definition, str) and definition:
            hint += f" It must match this {syntax} grammar:\n{definition}"
    function: dict[str, Any] = {"name": name}
    if description:
        function["description"] = description
    function["parameters"] = {
        "type": "object",
        "properties": {"input": {"type": "string", "description": hint}},
        "required": ["input"],
    }
    return {"type": "function", "function": function}


def _allowed_tools(mode: str, allowed: Any, tools: list[dict[str, Any]]) -> Any:
    """``allowed_tools``: one function under ``required`` is a named choice; a subset of the
    declared functions cannot be expressed to the engine, so it is refused by name rather than
    widened to every tool."""
    names = [
        _required_str(require_dict(t, "tool_choice.tools[]"), "name", "tool_choice.tools[]")
        for t in require_list(allowed, "tool_choice.tools")
        if isinstance(t, dict) and t.get("type") == "function"
    ]
    if mode == "required" and len(names) == 1:
        return {"type": "function", "function": {"name": names[0]}}
    declared = {(tool.get("function") or {}).get("name") for tool in tools}
    if names and set(names) != declared:
        raise InvalidRequest(
            "tool_choice allowed_tools naming some but not all of the declared functions is "
            "not supported: name one function, or declare only the allowed ones"
        )
    return mode


def _convert_tool_choice(value: Any, tools: list[dict[str, Any]]) -> Any:
    if value is None or value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict):
        kind = value.get("type")
        if kind in ("function", "custom"):
            name = _required_str(value, "name", "tool_choice")
            return {"type": "function", "function": {"name": name}}
        if kind == "allowed_tools":
            mode = value.get("mode")
            if mode not in ("auto", "required"):
                raise InvalidRequest("tool_choice.mode must be 'auto' or 'required'")
            return _allowed_tools(mode, value.get("tools"), tools)
        if isinstance(kind, str):
            # A hosted tool (web_search, ...) was dropped; the model may still pick others.
            return "auto"
    raise InvalidRequest("tool_choice must be 'auto', 'none', 'required' or a tool object")


# --------------------------------------------------------------------------- request: items


class _History:
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
        if kind in _OUTPUT_ITEMS:
            self._close_turn()
            self._tool_output(item, kind)
            return
        self._flush_tool_images()
        if kind == "message":
            self._message(item)
        elif kind == "reasoning":
            self._reasoning(item)
        elif kind in _CALL_ITEMS:
            self._call(item, kind)
        elif kind == "item_reference":
            return
        elif isinstance(kind, str):
            # Hosted-tool calls, compaction summaries, ...: nothing the engine can replay.
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
            call_id = _required_str(item, "id", "a local_shell_call_output")
        else:
            call_id = _required_str(item, "call_id", f"a {kind}")
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


def _history_call(item: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """A replayed call item as a chat tool call (ids kept verbatim)."""
    if kind == "function_call":
        call_id = _required_str(item, "call_id", "a function_call")
        name = _required_str(item, "name", "a function_call")
        arguments = item.get("arguments")
        if arguments is not None and not isinstance(arguments, str | dict):
            raise InvalidRequest("function_call arguments must be a string")
        text = arguments_text(arguments)
    elif kind == "custom_tool_call":
        call_id = _required_str(item, "call_id", "a custom_tool_call")
        name = _required_str(item, "name", "a custom_tool_call")
        text = orjson.dumps({"input": _required_str(item, "input", "a custom_tool_call")}).decode()
    else:
        call_id = item.get("call_id") or _required_str(item, "id", "a local_shell_call")
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
    workdir = _optional_str(action, "working_directory")
    if workdir is not None:
        arguments["workdir"] = workdir
    timeout = optional_number(action, "timeout_ms", int)
    if timeout is not None:
        arguments["timeout_ms"] = timeout
    return arguments


def _reasoning_text(item: Mapping[str, Any]) -> str:
    """Our own blob gives the exact text back; otherwise raw reasoning, else the summary."""
    decoded = decode_reasoning(_optional_str(item, "encrypted_content"))
    if decoded is not None:
        return decoded
    content = [
        _required_str(require_dict(p, "reasoning content"), "text", "reasoning content")
        for p in require_list(item.get("content"), "reasoning content")
    ]
    if any(content):
        return join_text(content)
    summary = [
        _required_str(require_dict(p, "reasoning summary"), "text", "reasoning summary")
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
            parts.append({"type": "text", "text": _required_str(part, "text", f"a {kind} part")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": _required_str(part, "refusal", "a refusal")})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise InvalidRequest("input_image needs an image_url (file ids are not supported)")
            image: dict[str, Any] = {"url": url}
            if isinstance(part.get("detail"), str):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            data = part.get("file_data")
            if not isinstance(data, str) or not data:
                raise InvalidRequest("input_file needs file_data (file ids are not supported)")
            file: dict[str, Any] = {"file_data": data}
            if isinstance(part.get("filename"), str):
                file["filename"] = part["filename"]
            parts.append({"type": "file", "file": file})
        else:
            raise InvalidRequest(f"unsupported content part type {kind!r}")
    return parts


def _text_only(content: Any, what: str) -> str:
    parts = _parts(content)
    if any(p["type"] != "text" for p in parts):
        raise InvalidRequest(f"{what} may only contain text")
    return join_text([p["text"] for p in parts])


# --------------------------------------------------------------------------- response


def _base_id(completion: Completion) -> str:
    return completion.id.removeprefix("resp_") or "0"


def _output_items(completion: Completion, request: NormalizedRequest) -> list[dict[str, Any]]:
    """Output items in the order a turn produces them: reasoning, message, calls."""
    base = _base_id(completion)
    items: list[dict[str, Any]] = []
    if completion.reasoning:
        items.append(
            {
                "id": f"rs_{base}_{len(items)}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": completion.reasoning}],
                "encrypted_content": encode_reasoning(completion.reasoning),
            }
        )
    if completion.content or not (items or completion.tool_calls):
        status = "incomplete" if completion.finish_reason == "length" else "completed"
        items.append(
            {
                "id": f"msg_{base}_{len(items)}",
                "type": "message",
                "role": "assistant",
                "status": status,
                "content": [_output_text(completion.content, _text_logprobs(completion, request))],
            }
        )
    for number, call in enumerate(completion.tool_calls):
        call_id = call.id or f"call_{base}_{number}"
        items.append(_call_item(call, call_id, f"{base}_{len(items)}", _state(request)))
    return items


def _output_text(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def _text_logprobs(completion: Completion, request: NormalizedRequest) -> list[dict[str, Any]]:
    if not request.logprobs:
        return []
    return [
        {
            "token": t.token,
            "logprob": t.logprob,
            "bytes": list(t.token.encode()),
            "top_logprobs": [],
        }
        for t in completion.logprobs or ()
    ]


def _call_item(call: ToolCall, call_id: str, suffix: str, state: ResponsesState) -> dict[str, Any]:
    """A tool call in the item type the harness declared the tool with."""
    if call.name in state.custom_tools:
        args = arguments_object(call.arguments)
        value = args.get("input")
        # A model that ignored the one-string schema still gets its text to the harness.
        text = value if isinstance(value, str) and len(args) == 1 else call.arguments
        return {
            "id": f"ctc_{suffix}",
            "type": "custom_tool_call",
            "call_id": call_id,
            "name": call.name,
            "input": text,
        }
    if call.name == LOCAL_SHELL and state.local_shell:
        action = _shell_action(arguments_object(call.arguments))
        if action is not None:
            return {
                "id": f"lsc_{suffix}",
                "type": "local_shell_call",
                "call_id": call_id,
                "status": "completed",
                "action": action,
            }
    return {
        "id": f"fc_{suffix}",
        "type": "function_call",
        "call_id": call_id,
        "name": call.name,
        "arguments": call.arguments,
        "status": "completed",
    }


def _shell_action(args: Mapping[str, Any]) -> dict[str, Any] | None:
    """A ``local_shell`` call's arguments as an exec action, or None when they do not fit."""
    command = args.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        return None
    action: dict[str, Any] = {"type": "exec", "command": command, "env": {}}
    if isinstance(args.get("workdir"), str):
        action["working_directory"] = args["workdir"]
    timeout = args.get("timeout_ms")
    if isinstance(timeout, int) and not isinstance(timeout, bool):
        action["timeout_ms"] = timeout
    return action


def _response_object(
    completion: Completion,
    request: NormalizedRequest,
    output: list[dict[str, Any]],
    *,
    in_progress: bool = False,
) -> dict[str, Any]:
    echo = _state(request).echo
    status, incomplete = "completed", None
    if in_progress:
        status = "in_progress"
    elif completion.finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    elif completion.finish_reason == "content_filter":
        status, incomplete = "incomplete", {"reason": "content_filter"}
    return {
        "id": "resp_" + _base_id(completion),
        "object": "response",
        "created_at": completion.created,
        "status": status,
        "completed_at": completion.created if status == "completed" else None,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": echo.get("instructions"),
        "max_output_tokens": request.params.max_tokens,
        "model": request.requested_model or request.model or completion.model,
        "output": output,
        "parallel_tool_calls": echo.get("parallel_tool_calls", True),
        "previous_response_id": echo.get("previous_response_id"),
        "reasoning": echo.get("reasoning", {"effort": None, "summary": None}),
        "store": echo.get("store", True),
        "temperature": request.params.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": echo.get("tool_choice", "auto"),
        "tools": echo.get("tools", []),
        "top_p": request.params.top_p,
        "truncation": "disabled",
        "usage": None if in_progress else _usage(completion),
        "metadata": {},
    }


def _usage(completion: Completion) -> dict[str, Any]:
    return {
        "input_tokens": completion.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }


# --------------------------------------------------------------------------- stream


class _Events:
    """Named SSE frames with the increasing ``sequence_number`` every Responses event carries."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self._sequence = 0

    def emit(self, kind: str, **fields: Any) -> None:
        self.frames.append(sse({"type": kind, **fields, "sequence_number": self._sequence}, kind))
        self._sequence += 1


def _stream_item(events: _Events, index: int, item: dict[str, Any]) -> None:
    """One output item's events: added, its content (whole, in one delta), done."""
    kind = item["type"]
    where = {"item_id": item["id"], "output_index": index}
    if kind == "reasoning":
        text = item["summary"][0]["text"]
        events.emit("response.output_item.added", output_index=index, item={**item, "summary": []})
        part = {"type": "summary_text", "text": text}
        events.emit(
            "response.reasoning_summary_part.added",
            **where,
            summary_index=0,
            part={**part, "text": ""},
        )
        events.emit("response.reasoning_summary_text.delta", **where, summary_index=0, delta=text)
        events.emit("response.reasoning_summary_text.done", **where, summary_index=0, text=text)
        events.emit("response.reasoning_summary_part.done", **where, summary_index=0, part=part)
    elif kind == "message":
        text = item["content"][0]["text"]
        logprobs = item["content"][0]["logprobs"]
        added = {**item, "status": "in_progress", "content": []}
        events.emit("response.output_item.added", output_index=index, item=added)
        at = {**where, "content_index": 0}
        events.emit("response.content_part.added", **at, part=_output_text(""))
        if text:
            events.emit("response.output_text.delta", **at, delta=text, logprobs=logprobs)
        events.emit("response.output_text.done", **at, text=text, logprobs=logprobs)
        events.emit("response.content_part.done", **at, part=_output_text(text, logprobs))
    elif kind == "function_call":
        added = {**item, "arguments": "", "status": "in_progress"}
        events.emit("response.output_item.added", output_index=index, item=added)
        events.emit("response.function_call_arguments.delta", **where, delta=item["arguments"])
        events.emit("response.function_call_arguments.done", **where, arguments=item["arguments"])
    elif kind == "custom_tool_call":
        events.emit("response.output_item.added", output_index=index, item={**item, "input": ""})
        events.emit("response.custom_tool_call_input.delta", **where, delta=item["input"])
        events.emit("response.custom_tool_call_input.done", **where, input=item["input"])
    else:
        added = {**item, "status": "in_progress"}
        events.emit("response.output_item.added", output_index=index, item=added)
    events.emit("response.output_item.done", output_index=index, item=item)


# --------------------------------------------------------------------------- errors


def _failed_code(error: GatewayError) -> str:
    """The ``response.error.code`` (a closed set in the SDK) that makes Codex react rightly.

    Codex retries ``server_error`` and ``rate_limit_exceeded`` with backoff (right for a paused
    or busy engine) and gives up on ``invalid_prompt`` (right for a client error); other
    codes, such as ``server_is_overloaded``, would end its turn even for a transient failure.
    """
    if error.kind == "rate_limit":
        return "rate_limit_exceeded"
    return "server_error" if error.status >= 500 else "invalid_prompt"
