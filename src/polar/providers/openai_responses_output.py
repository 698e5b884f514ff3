"""A completion as the Responses API's output items, Response object and stream events.
Part of :mod:`polar.providers.openai_responses`, which owns the reply as a whole."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from polar.providers.base import (
    arguments_object,
    sse,
)
from polar.providers.openai_responses_input import LOCAL_SHELL
from polar.providers.reasoning_codec import encode_reasoning
from polar.providers.types import (
    Completion,
    NormalizedRequest,
    ToolCall,
)


@dataclass
class ResponsesState:
    """What this adapter remembers between parsing a request and rendering its reply."""

    custom_tools: list[str] = field(default_factory=list)  # calls to these are custom_tool_call
    # A namespace's function by the flat name the model sees: (namespace, name) of its calls.
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    local_shell: bool = False  # a local_shell tool was declared: its calls are local_shell_call
    echo: dict[str, Any] = field(default_factory=dict)  # request fields the Response repeats
    previous_response_id: str | None = None  # the stored response this call continues
    store: bool = True  # keep the Response for retrieval and continuation (the API's default)
    instructions: str | None = None  # leads the system message; never carried to a next call


def responses_state(request: NormalizedRequest) -> ResponsesState:
    state = request.adapter_state
    return state if isinstance(state, ResponsesState) else ResponsesState()


def _base_id(completion: Completion) -> str:
    return completion.id.removeprefix("resp_") or "0"


def output_items(completion: Completion, request: NormalizedRequest) -> list[dict[str, Any]]:
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
        items.append(_call_item(call, call_id, f"{base}_{len(items)}", responses_state(request)))
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
        custom = {
            "id": f"ctc_{suffix}",
            "type": "custom_tool_call",
            "call_id": call_id,
            "name": call.name,
            "input": text,
        }
        return _with_namespace(custom, state)
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
    item: dict[str, Any] = {
        "id": f"fc_{suffix}",
        "type": "function_call",
        "call_id": call_id,
        "name": call.name,
        "arguments": call.arguments,
        "status": "completed",
    }
    return _with_namespace(item, state)


def _with_namespace(item: dict[str, Any], state: ResponsesState) -> dict[str, Any]:
    """A call to a namespaced tool names its tool and namespace apart, as they were declared."""
    if item["name"] in state.namespaced:
        namespace, item["name"] = state.namespaced[item["name"]]
        item["namespace"] = namespace
    return item


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


def response_object(
    completion: Completion,
    request: NormalizedRequest,
    output: list[dict[str, Any]],
    *,
    in_progress: bool = False,
) -> dict[str, Any]:
    echo = responses_state(request).echo
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


class StreamEvents:
    """Named SSE frames with the increasing ``sequence_number`` every Responses event carries."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self._sequence = 0

    def emit(self, kind: str, **fields: Any) -> None:
        self.frames.append(sse({"type": kind, **fields, "sequence_number": self._sequence}, kind))
        self._sequence += 1


def stream_item(events: StreamEvents, index: int, item: dict[str, Any]) -> None:
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
