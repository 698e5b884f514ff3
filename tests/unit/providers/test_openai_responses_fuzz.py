"""Property tests: the Responses adapter never crashes on bad input and never garbles output."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from polar.errors import InvalidRequest
from polar.providers.base import RequestContext
from polar.providers.openai_responses import OpenAIResponsesProvider
from polar.providers.reasoning_codec import decode_reasoning
from polar.providers.types import Completion, ToolCall

from .test_openai_responses import APPLY_PATCH_TOOL, SHELL_TOOL, codex_request

PROVIDER = OpenAIResponsesProvider()
CTX = RequestContext(path="/v1/responses")

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
# Keys this API reads, so mutations hit the parser's branches rather than ignored fields.
known_keys = st.sampled_from(
    [
        "type", "role", "content", "text", "input", "call_id", "name", "arguments", "output",
        "summary", "encrypted_content", "action", "command", "tools", "tool_choice", "model",
        "instructions", "image_url", "parameters", "format", "id", "stream", "max_output_tokens",
    ]
)  # fmt: skip


def parse_or_invalid(body: Any) -> None:
    try:
        request = PROVIDER.parse_request(body, CTX)
    except InvalidRequest:
        return
    json.dumps(request.chat_body())  # a request that parses is a JSON-able engine body


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_arbitrary_json_parses_or_is_invalid(body: Any) -> None:
    parse_or_invalid(body)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(known_keys, json_values, max_size=6))
def test_arbitrary_bodies_with_known_keys(body: dict[str, Any]) -> None:
    parse_or_invalid(body)


def _containers(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to every dict and list inside ``value``."""
    found = []
    if isinstance(value, dict):
        found.append(path)
        for key, child in value.items():
            found += _containers(child, (*path, key))
    elif isinstance(value, list):
        found.append(path)
        for index, child in enumerate(value):
            found += _containers(child, (*path, index))
    return found


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_codex_requests_parse_or_are_invalid(data: st.DataObject) -> None:
    body = copy.deepcopy(codex_request())  # it shares the module's tool dicts
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_containers(body)))
        target: Any = body
        for step in path:
            target = target[step]
        if isinstance(target, dict):
            key = data.draw(st.sampled_from(sorted(target)) | known_keys if target else known_keys)
            if key in target and data.draw(st.booleans()):
                del target[key]
            else:
                target[key] = data.draw(json_values)
        elif target:
            index = data.draw(st.integers(0, len(target) - 1))
            target[index] = data.draw(json_values)
    parse_or_invalid(body)


# --------------------------------------------------------------------------- render

json_objects = st.dictionaries(st.text(max_size=6), json_values, max_size=4)
tool_calls = st.lists(
    st.builds(
        ToolCall,
        id=st.text(max_size=10),
        name=st.sampled_from(["shell", "apply_patch", "local_shell", "other"]),
        arguments=json_objects.map(lambda o: json.dumps(o, ensure_ascii=False)),
    ),
    max_size=3,
)
completions = st.builds(
    Completion,
    id=st.text(max_size=12),
    model=st.just("engine"),
    content=st.text(),
    reasoning=st.none() | st.text(),
    tool_calls=tool_calls,
    finish_reason=st.sampled_from(["stop", "length", "tool_calls", "content_filter"]),
    prompt_tokens=st.integers(0, 10**6),
    completion_tokens=st.integers(0, 10**6),
    created=st.integers(0, 2**31),
)


def parse_frames(frames: list[bytes]) -> list[dict[str, Any]]:
    """Each frame is exactly ``event: <type>`` then ``data: <json>`` with the same type."""
    events = []
    for frame in frames:
        assert frame.endswith(b"\n\n")
        lines = frame[:-2].split(b"\n")
        assert len(lines) == 2
        assert lines[0].startswith(b"event: ") and lines[1].startswith(b"data: ")
        data = json.loads(lines[1][len(b"data: ") :])
        assert data["type"] == lines[0][len(b"event: ") :].decode()
        events.append(data)
    return events


@settings(max_examples=200, deadline=None)
@given(completions)
def test_any_completion_streams_back_to_the_same_content(completion: Completion) -> None:
    request = PROVIDER.parse_request(
        {
            "model": "asked",
            "input": "x",
            "tools": [SHELL_TOOL, APPLY_PATCH_TOOL, {"type": "local_shell"}],
        },
        CTX,
    )
    events = parse_frames(PROVIDER.render_stream(completion, request))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.completed"
    final = events[-1]["response"]
    assert final == PROVIDER.render_response(completion, request)
    assert final["model"] == "asked"
    assert final["usage"]["total_tokens"] == completion.prompt_tokens + completion.completion_tokens

    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == final["output"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == completion.content
    summary = "".join(
        e["delta"] for e in events if e["type"] == "response.reasoning_summary_text.delta"
    )
    assert summary == (completion.reasoning or "")
    for item in done:
        if item["type"] == "reasoning":
            assert decode_reasoning(item["encrypted_content"]) == completion.reasoning

    calls = [i for i in done if i["type"] not in ("reasoning", "message")]
    assert len(calls) == len(completion.tool_calls)
    for item, call in zip(calls, completion.tool_calls, strict=True):
        if call.id:
            assert item["call_id"] == call.id
        if item["type"] == "function_call":
            assert json.loads(item["arguments"]) == json.loads(call.arguments)
        elif item["type"] == "custom_tool_call":
            assert item["input"] == custom_input(call)
        else:
            assert item["action"]["command"] == json.loads(call.arguments)["command"]

    # Replaying the items gives back the turn as sampled (local_shell keeps only its own keys).
    replay = PROVIDER.parse_request(
        {"input": done, "tools": request.adapter_state.echo["tools"]}, CTX
    )
    assistants = [m for m in replay.messages if m["role"] == "assistant"]
    assert len(assistants) == 1
    assert assistants[0]["content"] == completion.content
    assert assistants[0].get("reasoning") == (completion.reasoning or None)
    replayed = assistants[0].get("tool_calls", [])
    assert [c["id"] for c in replayed] == [i["call_id"] for i in calls]
    assert [c["function"]["name"] for c in replayed] == [c.name for c in completion.tool_calls]
    for again, call, item in zip(replayed, completion.tool_calls, calls, strict=True):
        arguments = json.loads(again["function"]["arguments"])
        if item["type"] == "function_call":
            assert arguments == json.loads(call.arguments)
        elif item["type"] == "custom_tool_call":
            assert arguments == {"input": custom_input(call)}


def custom_input(call: ToolCall) -> str:
    """What a custom tool receives: the one string argument, or the raw text if off-schema."""
    args = json.loads(call.arguments)
    value = args.get("input")
    return value if isinstance(value, str) and len(args) == 1 else call.arguments
