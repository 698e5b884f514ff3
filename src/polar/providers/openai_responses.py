"""OpenAI Responses API (``POST .../responses``), the wire API Codex CLI speaks.

Requests are lists of typed items rather than chat messages. The one conversion that matters
most for training is grouping: a sampled turn comes back as a ``reasoning`` item, an assistant
``message`` item and ``function_call`` items, and all of them must fold into ONE chat assistant
message (reasoning, content and every tool call, in order). Splitting them, or hanging the
reasoning on the wrong message, changes the re-rendered prompt and breaks prefix merging.

Codex's non-function tools are mapped to plain functions the engine can call: a ``custom``
(freeform) tool becomes a function taking one string ``input``, ``local_shell`` a function with
a command array. Calls to them are rendered back as ``custom_tool_call`` / ``local_shell_call``
items so the harness runs them as it expects. A ``namespace`` (how Codex sends each MCP
server's tools) is flattened into the tool list, each function named as Codex itself flattens
one (``mcp__server__tool``), and calls to them go back as ``function_call`` items carrying
``name`` and ``namespace`` apart; a replayed namespaced call renders as the flat name the model
sampled. Hosted tools (web search, file search, ...) run inside OpenAI's service: nothing here
can run them, so they are refused by name (as Anthropic's server tools and Gemini's built-in
tools are), never dropped while the reply's ``tools`` echo them as available.
``reasoning.effort`` is the reasoning effort (``none``: the switch off).

The input items' folding lives in ``openai_responses_input.py`` and the output items, Response
object and stream events in ``openai_responses_output.py``; this module is the adapter, its
request fields and tools, and its errors.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from polar.errors import GatewayError, InvalidRequest, NotFound
from polar.providers.base import (
    COUNT_TOKENS,
    GENERATE,
    Provider,
    RequestContext,
    new_id,
    optional_number,
    require_dict,
    require_list,
    sse,
)
from polar.providers.logprobs import sampled_logprobs
from polar.providers.openai_chat import OPENAI_ROUTING
from polar.providers.openai_errors import openai_error_body
from polar.providers.openai_responses_input import (
    COMPACT_LOCALLY,
    LOCAL_SHELL,
    History,
    call_name,
    flat_tool_name,
    optional_str,
    required_str,
)
from polar.providers.openai_responses_output import (
    ResponsesState,
    StreamEvents,
    output_items,
    response_object,
    responses_state,
    stream_item,
)
from polar.providers.reasoning import openai_effort
from polar.providers.routing import ProviderRouting
from polar.providers.stateful import RETRIEVE, StatefulReplies
from polar.providers.types import (
    CaptureTags,
    Completion,
    Message,
    NormalizedRequest,
    ReasoningControls,
    ResponseFormat,
    SamplingParams,
    Tool,
)

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

COMPACT = "compact"  # POST /responses/compact: refused by name (see parse_request)
_COMPACT_REFUSED = (
    "POST /responses/compact is not served: OpenAI's service compacts a conversation there "
    "into an encrypted compaction item, which nothing here can make or read. " + COMPACT_LOCALLY
)

_CONVERSATION_REFUSED = (
    "conversation is not supported by this gateway; use previous_response_id to continue a "
    "stored response"
)


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
        if path.endswith("/responses/compact"):
            return COMPACT
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
        if self.operation(ctx) == COMPACT:
            raise InvalidRequest(_COMPACT_REFUSED)
        body = require_dict(body)
        model = optional_str(body, "model") or ""
        instructions = optional_str(body, "instructions")
        tools = _convert_tools(body.get("tools"))

        history = History()
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
        previous = optional_str(body, "previous_response_id")
        _check_accepted(body)
        state = ResponsesState(
            custom_tools=tools.custom,
            namespaced=tools.namespaced,
            local_shell=tools.local_shell,
            echo=_echo_fields(body),
            previous_response_id=previous,
            store=body.get("store") is not False,
            instructions=instructions or None,
        )
        capture = CaptureTags(ignored_items=history.ignored)
        if tools.namespaced:
            capture.feature("namespace tools", "mapped")
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
            requested_model=model,
            capture=capture,
            adapter_state=state,
            response_format=_text_format(body.get("text"), capture),
            parallel_tool_calls=_parallel_tool_calls(body, bool(tools.tools), capture),
            logprobs=_logprobs_asked(body, capture),
            reasoning=_reasoning(body),
        )

    def render_response(self, completion: Completion, request: NormalizedRequest) -> dict[str, Any]:
        return response_object(completion, request, output_items(completion, request))

    def render_stream(self, completion: Completion, request: NormalizedRequest) -> list[bytes]:
        items = output_items(completion, request)
        events = StreamEvents()
        opening = response_object(completion, request, [], in_progress=True)
        events.emit("response.created", response=opening)
        events.emit("response.in_progress", response=opening)
        for index, item in enumerate(items):
            stream_item(events, index, item)
        # Always response.completed, even for a length stop (whose status is "incomplete"):
        # Codex treats response.incomplete as a failed stream and retries the same request.
        events.emit("response.completed", response=response_object(completion, request, items))
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
        self, completion: Completion, request: NormalizedRequest, *, always: bool = False
    ) -> tuple[str, dict[str, Any]] | None:
        if not (always or responses_state(request).store):
            return None
        reply = self.render_response(completion, request)
        return reply["id"], reply

    def continues(self, request: NormalizedRequest) -> str | None:
        return responses_state(request).previous_response_id

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
                own.pop(0).get("content") or "", responses_state(request).instructions
            )
        parts = (responses_state(request).instructions or "", old_system, new_system)
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


def _optional_bool(body: Mapping[str, Any], key: str) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest(f"{key} must be a boolean")
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


def _reasoning(body: Mapping[str, Any]) -> ReasoningControls:
    """``reasoning.effort``: the effort, or (``none``) reasoning switched off."""
    if body.get("reasoning") is None:
        return ReasoningControls()
    return openai_effort(
        require_dict(body["reasoning"], "reasoning").get("effort"), "reasoning.effort"
    )


def _check_accepted(body: Mapping[str, Any]) -> None:
    """Fields accepted and ignored still get their types checked, as the real API does."""
    _optional_bool(body, "store")
    _optional_bool(body, "parallel_tool_calls")
    if body.get("metadata") is not None:
        require_dict(body["metadata"], "metadata")
    include = require_list(body.get("include"), "include")
    if not all(isinstance(v, str) for v in include):
        raise InvalidRequest("include must be an array of strings")


def _without_lead(system: str, instructions: Any) -> str:
    """A system message's text less the ``instructions`` it starts with (joined by a blank line,
    as :class:`History` joins them)."""
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
    custom: list[str] = field(default_factory=list)
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    local_shell: bool = False


def _convert_tools(raw: Any) -> _Tools:
    out = _Tools()
    for tool in require_list(raw, "tools"):
        tool = require_dict(tool, "each tool")
        kind = tool.get("type")
        if kind == "function":
            out.tools.append(_function_tool(tool))
        elif kind == "namespace":
            _namespace_tools(tool, out)
        elif kind == "custom":
            out.tools.append(_custom_tool(tool))
            out.custom.append(tool["name"])
        elif kind == LOCAL_SHELL:
            out.tools.append(copy.deepcopy(_LOCAL_SHELL_TOOL))
            out.local_shell = True
        elif isinstance(kind, str):
            raise _hosted_tool(kind)
        else:
            raise InvalidRequest("each tool needs a string 'type'")
    if out.namespaced:
        _check_unique(out.tools)
    return out


def _namespace_tools(tool: Mapping[str, Any], out: _Tools) -> None:
    """A namespace's function and custom tools, each under its flat name (the only name the
    model sees)."""
    namespace = required_str(tool, "name", "a namespace tool")
    for inner in require_list(tool.get("tools"), f"tools of namespace {namespace!r}"):
        inner = require_dict(inner, f"each tool of namespace {namespace!r}")
        kind = inner.get("type")
        if kind == "function":
            converted = _function_tool(inner)
        elif kind == "custom":
            converted = _custom_tool(inner)
        else:
            raise InvalidRequest(
                f"namespace {namespace!r}: only function and custom tools may be namespaced, "
                f"not {kind!r}"
            )
        name = converted["function"]["name"]
        flat = flat_tool_name(namespace, name)
        converted["function"]["name"] = flat
        out.tools.append(converted)
        out.namespaced[flat] = (namespace, name)
        if kind == "custom":
            out.custom.append(flat)


def _check_unique(tools: list[Tool]) -> None:
    """Two tools the model would know by one name (a function named like a namespace's flat
    name) would make its calls ambiguous: refused by name rather than guessed."""
    seen: set[str] = set()
    for tool in tools:
        name = tool["function"]["name"]
        if name in seen:
            raise InvalidRequest(
                f"two tools are both named {name!r} for the model (a namespace's function is "
                "named namespace__function): rename one"
            )
        seen.add(name)


def _hosted_tool(kind: str) -> InvalidRequest:
    """A hosted tool (web_search, file_search, code_interpreter, ...) runs inside OpenAI's
    service: refused by name, as the real API refuses a tool a model does not support."""
    return InvalidRequest(
        f"the hosted tool {kind!r} runs inside OpenAI's service and is not available here; "
        'declare a function tool instead (Codex: web_search = "disabled")'
    )


def _function_tool(tool: Mapping[str, Any]) -> Tool:
    name = required_str(tool, "name", "a function tool")
    description = optional_str(tool, "description")
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
    name = required_str(tool, "name", "a custom tool")
    description = optional_str(tool, "description")
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
        required_str(require_dict(t, "tool_choice.tools[]"), "name", "tool_choice.tools[]")
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
            name = call_name(value, "tool_choice")
            return {"type": "function", "function": {"name": name}}
        if kind == "allowed_tools":
            mode = value.get("mode")
            if mode not in ("auto", "required"):
                raise InvalidRequest("tool_choice.mode must be 'auto' or 'required'")
            return _allowed_tools(mode, value.get("tools"), tools)
        if isinstance(kind, str):
            raise _hosted_tool(kind)
    raise InvalidRequest("tool_choice must be 'auto', 'none', 'required' or a tool object")


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
