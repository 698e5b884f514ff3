"""A completion as the Interactions API's steps, Interaction resource and stream events. Part of
:mod:`polar.providers.google_interactions`, which owns the reply as a whole.

A sampled turn is a ``thought`` step (our signature carries the reasoning; its summary is the
reasoning itself unless ``thinking_summaries`` is ``none``), a ``model_output`` step and one
``function_call`` step per call, in that order. A stream is bare ``data:`` frames, each one event
(``event_type``): ``interaction.created``, then ``step.start`` / ``step.delta`` / ``step.stop``
per step, then ``interaction.completed`` with the usage; as the API does, it carries no
``user_input`` step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from polar.providers.base import arguments_object, sse
from polar.providers.reasoning_codec import encode_reasoning_b64
from polar.providers.types import Completion, NormalizedRequest


@dataclass
class InteractionsState:
    """What this adapter remembers between parsing a request and rendering its reply."""

    summaries: bool = True  # thought steps carry the reasoning as their summary
    previous_interaction_id: str | None = None  # the stored interaction this call continues
    store: bool = True  # keep the interaction for GET and continuation (the API's default)
    echo: dict[str, Any] = field(default_factory=dict)  # request fields the resource repeats
    input_steps: list[dict[str, Any]] = field(default_factory=list)  # the stored timeline's start


def interactions_state(request: NormalizedRequest) -> InteractionsState:
    state = request.adapter_state
    return state if isinstance(state, InteractionsState) else InteractionsState()


def interaction_id(completion: Completion) -> str:
    return "v1_" + (completion.id.removeprefix("chatcmpl-") or "0")


def output_steps(completion: Completion, request: NormalizedRequest) -> list[dict[str, Any]]:
    """The steps of one sampled turn: thought, model output, function calls."""
    steps: list[dict[str, Any]] = []
    if completion.reasoning:
        thought: dict[str, Any] = {
            "type": "thought",
            "signature": encode_reasoning_b64(completion.reasoning),
        }
        if interactions_state(request).summaries:
            thought["summary"] = [{"type": "text", "text": completion.reasoning}]
        steps.append(thought)
    if completion.content or not (steps or completion.tool_calls):
        steps.append(
            {"type": "model_output", "content": [{"type": "text", "text": completion.content}]}
        )
    steps.extend(
        {
            "type": "function_call",
            "id": call.id,
            "name": call.name,
            "arguments": arguments_object(call.arguments),
        }
        for call in completion.tool_calls
    )
    return steps


def interaction(
    completion: Completion,
    request: NormalizedRequest,
    steps: list[dict[str, Any]] | None,
    *,
    in_progress: bool = False,
) -> dict[str, Any]:
    """The Interaction resource; ``steps`` None leaves them out (the stream's lifecycle events)."""
    created = _timestamp(completion.created)
    resource: dict[str, Any] = {
        "id": interaction_id(completion),
        "object": "interaction",
        "model": request.requested_model or request.model or completion.model,
        "status": "in_progress" if in_progress else _status(completion),
        "created": created,
        "updated": created,
    }
    if steps is not None:
        resource["steps"] = steps
    if not in_progress:
        resource["usage"] = {
            "total_input_tokens": completion.prompt_tokens,
            "total_output_tokens": completion.completion_tokens,
            "total_tokens": completion.prompt_tokens + completion.completion_tokens,
        }
    if steps is not None:
        resource.update(interactions_state(request).echo)
    return resource


def stream_frames(completion: Completion, request: NormalizedRequest) -> list[bytes]:
    """The whole stream of one interaction, as SSE frames."""
    opening = interaction(completion, request, None, in_progress=True)
    frames = [sse({"event_type": "interaction.created", "interaction": opening})]
    for index, step in enumerate(output_steps(completion, request)):
        shell, deltas = _step_events(step)
        frames.append(sse({"event_type": "step.start", "index": index, "step": shell}))
        frames.extend(
            sse({"event_type": "step.delta", "index": index, "delta": delta}) for delta in deltas
        )
        frames.append(sse({"event_type": "step.stop", "index": index}))
    closing = interaction(completion, request, None)
    frames.append(sse({"event_type": "interaction.completed", "interaction": closing}))
    return frames


def _step_events(step: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A step as its ``step.start`` shell and the deltas that fill it."""
    kind = step["type"]
    if kind == "thought":
        deltas = [{"type": "thought_summary", "content": part} for part in step.get("summary", [])]
        deltas.append({"type": "thought_signature", "signature": step["signature"]})
        return {"type": "thought"}, deltas
    if kind == "model_output":
        return {"type": "model_output"}, [
            {"type": "text", "text": part["text"]} for part in step["content"]
        ]
    shell = {"type": kind, "id": step["id"], "name": step["name"], "arguments": {}}
    # Arguments stream as partial-JSON text; here one delta holds the whole object.
    return shell, [
        {"type": "arguments_delta", "arguments": orjson.dumps(step["arguments"]).decode()}
    ]


def _status(completion: Completion) -> str:
    """``requires_action`` when the client has calls to run, ``incomplete`` at a length or
    content-filter stop, else ``completed``."""
    if completion.tool_calls:
        return "requires_action"
    if completion.finish_reason in ("length", "content_filter"):
        return "incomplete"
    return "completed"


def _timestamp(created: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created or time.time()))
