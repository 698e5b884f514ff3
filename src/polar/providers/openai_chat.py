"""OpenAI Chat Completions (Qwen Code, opencode, Pi's default): already the normalized form.

Normalizing still matters: system and developer messages merge into one leading system
message, tool results sent as part lists become text, assistant refusals become text, legacy
``functions`` / ``function_call`` (and their history messages) become tools and tool calls and
are answered in the legacy shape (a named ``function_call`` forces that call as a named
``tool_choice`` does), ``reasoning_effort`` is the reasoning effort (``none``: the switch off),
and a ``custom`` (freeform) tool is refused by name: Chat Completions answers it with
``custom`` tool calls, which the gateway does not render (the Responses API serves them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from polar.errors import GatewayError, InvalidRequest
from polar.providers.base import (
    GENERATE,
    Provider,
    RequestContext,
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
from polar.providers.logprobs import sampled_logprobs
from polar.providers.openai_errors import openai_error_body
from polar.providers.reasoning import openai_effort
from polar.providers.routing import ProviderRouting
from polar.providers.types import (
    CaptureTags,
    Completion,
    Message,
    NormalizedRequest,
    ResponseFormat,
    SamplingParams,
    Tool,
)

_DONE = b"data: [DONE]\n\n"


@dataclass
class ChatState:
    """What this adapter remembers between parsing a request and rendering its reply."""

    include_usage: bool = False  # stream_options.include_usage: a final usage chunk
    # The request used the legacy ``functions``: the reply is a ``function_call`` message.
    legacy_functions: bool = False


# Chat completions and responses are both the OpenAI SDK's: one client, one set of facts.
OPENAI_ROUTING = ProviderRouting(
    client="openai",
    api_roots=("/v1",),
    base_url_suffix="/v1",
    base_url_env=("OPENAI_BASE_URL",),
    api_key_env=("OPENAI_API_KEY",),
)


class OpenAIChatProvider(Provider):
    name: ClassVar[str] = "openai_chat"
    routing: ClassVar[ProviderRouting] = OPENAI_ROUTING

    def operation(self, ctx: RequestContext) -> str | None:
        return GENERATE if ctx.path.rstrip("/").endswith("/chat/completions") else None

    def matches_body(self, body: Any) -> bool:
        return isinstance(body, dict) and isinstance(body.get("messages"), list)

    # -- request -------------------------------------------------------------------------

    def parse_request(self, body: Any, ctx: RequestContext) -> NormalizedRequest:
        body = require_dict(body)
        n = optional_number(body, "n", int)
        if n not in (None, 1):
            raise InvalidRequest("n must be 1: the gateway captures exactly one choice per call")
        system: list[str] = []
        messages: list[Message] = []
        capture = CaptureTags()
        _refuse_audio(body, capture)
        legacy_ids: dict[str, str] = {}  # function name -> id of its latest legacy call
        for i, raw in enumerate(require_list(body.get("messages"), "messages")):
            msg = require_dict(raw, f"messages[{i}]")
            role = msg.get("role")
            if role in ("system", "developer"):
                system.append(_text(msg.get("content"), f"messages[{i}].content"))
            elif role == "user":
                messages.append({"role": "user", "content": _user_content(msg.get("content"), i)})
            elif role == "assistant":
                messages.append(_assistant(msg, i, capture, legacy_ids))
            elif role in ("tool", "function"):
                call_id = msg.get("tool_call_id") or ""
                if role == "function":
                    call_id = _legacy_result_id(msg, i, legacy_ids)
                    capture.feature("legacy function messages", "mapped")
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(call_id),
                        "content": _text(msg.get("content"), f"messages[{i}].content"),
                    }
                )
            else:
                raise InvalidRequest(f"messages[{i}].role {role!r} is not supported")
        if system:
            messages.insert(0, {"role": "system", "content": join_text(system)})
        if not messages:
            raise InvalidRequest("messages must not be empty")
        tools = _tools(body, capture)
        legacy = _legacy_functions(body, capture)
        stream_options = body.get("stream_options")
        include_usage = isinstance(stream_options, dict) and bool(
            stream_options.get("include_usage")
        )
        max_tokens = optional_number(body, "max_completion_tokens", int)
        if max_tokens is None:
            max_tokens = optional_number(body, "max_tokens", int)
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise InvalidRequest("model must be a string")
        if not isinstance(body.get("stream", False), bool | None):
            raise InvalidRequest("stream must be a boolean")
        response_format = _response_format(body.get("response_format"))
        normalized = NormalizedRequest(
            provider=self.name,
            model=model if isinstance(model, str) else "",
            messages=messages,
            tools=tools,
            tool_choice=_tool_choice(_choice_field(body, legacy)) if tools else None,
            params=SamplingParams(
                max_tokens=max_tokens,
                temperature=optional_number(body, "temperature"),
                top_p=optional_number(body, "top_p"),
                top_k=optional_number(body, "top_k", int),
                stop=stop_list(body.get("stop")),
                seed=optional_number(body, "seed", int),
                presence_penalty=optional_number(body, "presence_penalty"),
                frequency_penalty=optional_number(body, "frequency_penalty"),
                logit_bias=_logit_bias(body.get("logit_bias")),
            ),
            stream=bool(body.get("stream")),
            requested_model=model,
            adapter_state=ChatState(include_usage=include_usage, legacy_functions=legacy),
            capture=capture,
            parallel_tool_calls=_parallel_tool_calls(body, legacy, bool(tools), capture),
            logprobs=_logprobs_asked(body, capture),
            response_format=response_format,
            reasoning=openai_effort(body.get("reasoning_effort"), "reasoning_effort"),
        )
        if response_format is not None:
            normalized.capture.feature("structured_output", "honoured")
        return normalized

    # -- response ------------------------------------------------------------------------

    def render_response(self, completion: Completion, request: NormalizedRequest) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": completion.content or None}
        if completion.reasoning:
            message["reasoning_content"] = completion.reasoning
        legacy = _legacy_reply(completion, request)
        if legacy is not None:
            message["function_call"] = legacy
        elif completion.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in completion.tool_calls
            ]
        return {
            "id": completion.id,
            "object": "chat.completion",
            "created": completion.created,
            "model": _model(completion, request),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": _finish_reason(completion, request),
                    "logprobs": _choice_logprobs(completion, request),
                }
            ],
            "usage": _usage(completion),
        }

    def render_stream(self, completion: Completion, request: NormalizedRequest) -> list[bytes]:
        base = {
            "id": completion.id,
            "object": "chat.completion.chunk",
            "created": completion.created,
            "model": _model(completion, request),
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            return sse(base | {"choices": [choice]})

        frames = [chunk({"role": "assistant", "content": ""})]
        if completion.reasoning:
            frames.append(chunk({"reasoning_content": completion.reasoning}))
        if completion.content:
            frames.append(chunk({"content": completion.content}))
        if request.logprobs:
            choice = {"index": 0, "delta": {}, "finish_reason": None}
            choice["logprobs"] = _choice_logprobs(completion, request)
            frames.append(sse(base | {"choices": [choice]}))
        legacy = _legacy_reply(completion, request)
        if legacy is not None:
            frames.append(chunk({"function_call": legacy}))
        for index, call in enumerate([] if legacy else completion.tool_calls):
            frames.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call.id,
                                "type": "function",
                                "function": {"name": call.name, "arguments": call.arguments},
                            }
                        ]
                    }
                )
            )
        frames.append(chunk({}, _finish_reason(completion, request)))
        if _state(request).include_usage:
            frames.append(sse(base | {"choices": [], "usage": _usage(completion)}))
        frames.append(_DONE)
        return frames

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return openai_error_body(error)

    def stream_error(self, error: GatewayError) -> bytes:
        """A frame with an ``error`` key: the openai SDK's stream raises it as APIError."""
        return sse(openai_error_body(error)) + _DONE


def _logit_bias(value: Any) -> dict[str, float] | None:
    """Token id -> bias, passed to the engine as is (it samples with it, so the captured
    logprobs are the ones it sampled from)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(k, str)
        and k.lstrip("-").isdigit()
        and isinstance(v, int | float)
        and not isinstance(v, bool)
        and -100 <= v <= 100
        for k, v in value.items()
    ):
        raise InvalidRequest("logit_bias must map token ids to numbers between -100 and 100")
    return {k: float(v) for k, v in value.items()} or None


def _refuse_audio(body: Mapping[str, Any], capture: CaptureTags) -> None:
    """Audio output needs an audio model the gateway does not serve: a 400 naming it."""
    modalities = body.get("modalities")
    if body.get("audio") is not None or (isinstance(modalities, list) and "audio" in modalities):
        capture.feature("audio output", "refused")
        raise InvalidRequest(
            "audio output (modalities: audio, audio) is not supported by this gateway"
        )


def _logprobs_asked(body: Mapping[str, Any], capture: CaptureTags) -> bool:
    return sampled_logprobs(
        body.get("logprobs"),
        optional_number(body, "top_logprobs", int),
        capture,
        field="logprobs",
        top_field="top_logprobs",
        instead="use logprobs: true with top_logprobs 0",
    )


def _choice_logprobs(completion: Completion, request: NormalizedRequest) -> dict[str, Any] | None:
    if not request.logprobs:
        return None
    return {
        "content": [
            {
                "token": t.token,
                "logprob": t.logprob,
                "bytes": list(t.token.encode()),
                "top_logprobs": [],
            }
            for t in completion.logprobs or ()
        ],
        "refusal": None,
    }


def _legacy_reply(completion: Completion, request: NormalizedRequest) -> dict[str, str] | None:
    """The reply's ``function_call`` when the request used the legacy ``functions`` (one call
    per reply, as that API has; the engine was told ``parallel_tool_calls: false``)."""
    if not _state(request).legacy_functions or not completion.tool_calls:
        return None
    call = completion.tool_calls[0]
    return {"name": call.name, "arguments": call.arguments}


def _finish_reason(completion: Completion, request: NormalizedRequest) -> str:
    if completion.finish_reason == "tool_calls" and _legacy_reply(completion, request):
        return "function_call"
    return completion.finish_reason


def _model(completion: Completion, request: NormalizedRequest) -> str:
    return request.requested_model or request.model or completion.model


def _state(request: NormalizedRequest) -> ChatState:
    state = request.adapter_state
    return state if isinstance(state, ChatState) else ChatState()


def _usage(completion: Completion) -> dict[str, int]:
    return {
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }


def _text(content: Any, where: str) -> str:
    """Content that must be text (system, tool results): strings or lists of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    pieces = []
    for part in require_list(content, where):
        if isinstance(part, str):
            pieces.append(part)
        elif isinstance(part, dict) and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif isinstance(part, dict) and part.get("type") in ("image_url", "input_image"):
            raise InvalidRequest(f"{where}: images are supported in user messages only")
        else:
            raise InvalidRequest(f"{where} has a part that is not text")
    return join_text(pieces)


def _user_content(content: Any, i: int) -> str | list[dict[str, Any]]:
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[dict[str, Any]] = []
    for part in require_list(content, f"messages[{i}].content"):
        if isinstance(part, str):
            parts.append({"type": "text", "text": part})
            continue
        part = require_dict(part, f"messages[{i}].content part")
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            if not isinstance(url, str):
                raise InvalidRequest(f"messages[{i}] image_url needs a url")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise InvalidRequest(f"messages[{i}] has an unsupported content part type {kind!r}")
    return chat_content(parts)


def _assistant(
    msg: Mapping[str, Any], i: int, capture: CaptureTags, legacy_ids: dict[str, str]
) -> Message:
    out: Message = {
        "role": "assistant",
        "content": _assistant_text(msg, i, capture),
    }
    calls = []
    for j, raw in enumerate(require_list(msg.get("tool_calls"), f"messages[{i}].tool_calls")):
        call = require_dict(raw, f"messages[{i}].tool_calls[{j}]")
        fn = require_dict(call.get("function"), f"messages[{i}].tool_calls[{j}].function")
        if not isinstance(fn.get("name"), str):
            raise InvalidRequest(f"messages[{i}].tool_calls[{j}].function.name must be a string")
        calls.append(
            {
                "id": str(call.get("id") or new_id("call_")),
                "type": "function",
                "function": {"name": fn["name"], "arguments": arguments_text(fn.get("arguments"))},
            }
        )
    if msg.get("function_call") is not None:
        calls.append(_legacy_call(msg["function_call"], i, legacy_ids))
        capture.feature("legacy function messages", "mapped")
    if calls:
        out["tool_calls"] = calls
    reasoning = msg.get("reasoning") or msg.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        out["reasoning"] = reasoning
    return out


def _assistant_text(msg: Mapping[str, Any], i: int, capture: CaptureTags) -> str:
    """An assistant turn's text; a refusal (``refusal`` parts or ``message.refusal``) is what
    the model said, so it stays in the history as text."""
    where = f"messages[{i}].content"
    content = msg.get("content")
    refusals: list[str] = []
    if isinstance(content, list):
        kept = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "refusal":
                refusals.append(_text([{"text": part.get("refusal")}], f"{where} refusal part"))
            else:
                kept.append(part)
        content = kept
    if msg.get("refusal") is not None:
        refusals.append(_text(msg["refusal"], f"messages[{i}].refusal"))
    if refusals:
        capture.feature("assistant refusal", "mapped")
    return join_text([_text(content, where), *refusals])


def _legacy_call(raw: Any, i: int, legacy_ids: dict[str, str]) -> dict[str, Any]:
    """A legacy assistant ``function_call`` as a tool call, under an id its ``role: function``
    result finds by name (the legacy API has no call ids)."""
    where = f"messages[{i}].function_call"
    fn = require_dict(raw, where)
    if not isinstance(fn.get("name"), str):
        raise InvalidRequest(f"{where}.name must be a string")
    call_id = legacy_ids[fn["name"]] = f"call_fn{i}"
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": fn["name"], "arguments": arguments_text(fn.get("arguments"))},
    }


def _legacy_result_id(msg: Mapping[str, Any], i: int, legacy_ids: dict[str, str]) -> str:
    name = msg.get("name")
    if not isinstance(name, str):
        raise InvalidRequest(f"messages[{i}].name is required for role function")
    return legacy_ids.get(name, name)


def _legacy_functions(body: Mapping[str, Any], capture: CaptureTags) -> bool:
    """Whether the request declares its tools the legacy way (``functions``)."""
    if body.get("functions") is None:
        if body.get("function_call") is not None:
            raise InvalidRequest("function_call needs functions")
        return False
    if body.get("tools") is not None:
        raise InvalidRequest("functions and tools cannot be used together")
    capture.feature("legacy functions", "mapped")
    return True


def _choice_field(body: Mapping[str, Any], legacy: bool) -> Any:
    """``tool_choice``, or the legacy ``function_call`` ("auto", "none" or {"name": ...})."""
    if not legacy:
        return body.get("tool_choice")
    choice = body.get("function_call")
    if isinstance(choice, dict):
        return {"type": "function", "function": choice}
    return choice


def _parallel_tool_calls(
    body: Mapping[str, Any], legacy: bool, has_tools: bool, capture: CaptureTags
) -> bool | None:
    """``parallel_tool_calls: false`` (and the legacy API, which has one call per reply)."""
    value = body.get("parallel_tool_calls")
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest("parallel_tool_calls must be a boolean")
    if legacy:
        value = False
    if value is not False or not has_tools:
        return None
    if not legacy:
        capture.feature("parallel_tool_calls", "honoured")
    return False


def _tools(body: Mapping[str, Any], capture: CaptureTags) -> list[Tool]:
    tools: list[Tool] = []
    for i, raw in enumerate(require_list(body.get("tools"), "tools")):
        tool = require_dict(raw, f"tools[{i}]")
        kind = tool.get("type", "function")
        if kind != "function":
            capture.feature(f"tool {kind}", "refused")
            raise InvalidRequest(
                f"tools[{i}]: {kind!r} tools are not supported on Chat Completions by this "
                "gateway; declare a function tool (the Responses API serves custom tools)"
            )
        fn = require_dict(tool.get("function"), f"tools[{i}].function")
        tools.append({"type": "function", "function": _function(fn, f"tools[{i}].function")})
    for i, raw in enumerate(require_list(body.get("functions"), "functions")):
        tools.append(
            {"type": "function", "function": _function(require_dict(raw), f"functions[{i}]")}
        )
    return tools


def _function(fn: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(fn.get("name"), str):
        raise InvalidRequest(f"{where}.name must be a string")
    out: dict[str, Any] = {"name": fn["name"]}
    if isinstance(fn.get("description"), str):
        out["description"] = fn["description"]
    params = fn.get("parameters")
    out["parameters"] = params if isinstance(params, dict) else {"type": "object", "properties": {}}
    return out


def _tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict):
        fn = choice.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return {"type": "function", "function": {"name": fn["name"]}}
    raise InvalidRequest("tool_choice must be auto, none, required or a named function")


def _response_format(value: Any) -> ResponseFormat | None:
    """``response_format``: text (no constraint), json_object or json_schema; else a 400."""
    if value is None:
        return None
    spec = require_dict(value, "response_format")
    kind = spec.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object")
    if kind == "json_schema":
        schema = require_dict(spec.get("json_schema"), "response_format.json_schema")
        strict = schema.get("strict")
        return ResponseFormat(
            "json_schema",
            schema=require_dict(schema.get("schema"), "response_format.json_schema.schema"),
            name=str(schema.get("name") or "response"),
            strict=strict if isinstance(strict, bool) else None,
        )
    raise InvalidRequest(
        f"structured output: response_format type {kind!r} is not supported "
        "(text, json_object or json_schema)"
    )
