"""OpenAI Chat Completions (Qwen Code, opencode, Pi's default): already the normalized form.

Normalizing still matters: system and developer messages merge into one leading system
message, tool results sent as part lists become text, legacy ``functions`` become tools, and
non-function tools are dropped and recorded.
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
from polar.providers.openai_errors import openai_error_body
from polar.providers.types import (
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


class OpenAIChatProvider(Provider):
    name: ClassVar[str] = "openai_chat"

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
        for i, raw in enumerate(require_list(body.get("messages"), "messages")):
            msg = require_dict(raw, f"messages[{i}]")
            role = msg.get("role")
            if role in ("system", "developer"):
                system.append(_text(msg.get("content"), f"messages[{i}].content"))
            elif role == "user":
                messages.append({"role": "user", "content": _user_content(msg.get("content"), i)})
            elif role == "assistant":
                messages.append(_assistant(msg, i))
            elif role in ("tool", "function"):
                call_id = msg.get("tool_call_id") or msg.get("name") or ""
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
        tools, dropped = _tools(body)
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
            tool_choice=_tool_choice(body.get("tool_choice")) if tools else None,
            params=SamplingParams(
                max_tokens=max_tokens,
                temperature=optional_number(body, "temperature"),
                top_p=optional_number(body, "top_p"),
                top_k=optional_number(body, "top_k", int),
                stop=stop_list(body.get("stop")),
                seed=optional_number(body, "seed", int),
            ),
            stream=bool(body.get("stream")),
            dropped_tools=dropped,
            requested_model=model,
            adapter_state=ChatState(include_usage=include_usage),
            response_format=response_format,
        )
        if response_format is not None:
            normalized.capture.feature("structured_output", "honoured")
        return normalized

    # -- response ------------------------------------------------------------------------

    def render_response(self, completion: Completion, request: NormalizedRequest) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": completion.content or None}
        if completion.reasoning:
            message["reasoning_content"] = completion.reasoning
        if completion.tool_calls:
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
                    "finish_reason": completion.finish_reason,
                    "logprobs": None,
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
        for index, call in enumerate(completion.tool_calls):
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
        frames.append(chunk({}, completion.finish_reason))
        if _state(request).include_usage:
            frames.append(sse(base | {"choices": [], "usage": _usage(completion)}))
        frames.append(_DONE)
        return frames

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return openai_error_body(error)

    def stream_error(self, error: GatewayError) -> bytes:
        """A frame with an ``error`` key: the openai SDK's stream raises it as APIError."""
        return sse(openai_error_body(error)) + _DONE


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
            pieces.append("[image]")
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


def _assistant(msg: Mapping[str, Any], i: int) -> Message:
    out: Message = {
        "role": "assistant",
        "content": _text(msg.get("content"), f"messages[{i}].content"),
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
    if calls:
        out["tool_calls"] = calls
    reasoning = msg.get("reasoning") or msg.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        out["reasoning"] = reasoning
    return out


def _tools(body: Mapping[str, Any]) -> tuple[list[Tool], list[str]]:
    tools: list[Tool] = []
    dropped: list[str] = []
    for i, raw in enumerate(require_list(body.get("tools"), "tools")):
        tool = require_dict(raw, f"tools[{i}]")
        if tool.get("type", "function") != "function":
            dropped.append(str(tool.get("type")))
            continue
        fn = require_dict(tool.get("function"), f"tools[{i}].function")
        tools.append({"type": "function", "function": _function(fn, f"tools[{i}].function")})
    for i, raw in enumerate(require_list(body.get("functions"), "functions")):
        tools.append(
            {"type": "function", "function": _function(require_dict(raw), f"functions[{i}]")}
        )
    return tools, dropped


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
