"""Property tests: the Anthropic adapter never crashes on bad input and never garbles output."""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
from anthropic.types import TextBlock, ThinkingBlock, ToolUseBlock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.errors import InvalidRequest
from polar.providers.reasoning_codec import encode_reasoning
from polar.providers.types import FINISH_REASONS, Completion, ToolCall

from .test_anthropic import (
    CTX,
    PROVIDER,
    FakeGateway,
    ask,
    claude_code_body,
    parse_user,
    sdk_client,
)

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# What a JSON decoder can hand the adapter (Python's json also yields integers of any size).
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)  # what the gateway's JSON loader yields as ints
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)

# Values orjson can encode and the SDK's JSON parser reads back exactly.
tool_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
tool_arguments = st.dictionaries(st.text(max_size=10), tool_json, max_size=4)

VALID_BODIES = [
    claude_code_body(),
    {
        "model": "m",
        "max_tokens": 64,
        "system": "sys",
        "stop_sequences": ["END"],
        "tool_choice": {"type": "tool", "name": "f"},
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "u"}}]},
            {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]},
        ],
    },
]


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key/index path inside a JSON value."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths(item, (*prefix, index))
    return found


@st.composite
def mutated_requests(draw: st.DrawFn) -> Any:
    body = copy.deepcopy(draw(st.sampled_from(VALID_BODIES)))
    for _ in range(draw(st.integers(1, 3))):
        candidates = paths(body)
        if not candidates:
            break
        path = draw(st.sampled_from(candidates))
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()):
            parent[path[-1]] = draw(json_values)
        else:
            del parent[path[-1]]
    return body


def parses_or_rejects(body: Any) -> None:
    try:
        request = PROVIDER.parse_request(body, CTX)
    except InvalidRequest as err:
        assert err.status == 400 and err.message
        PROVIDER.error_body(err)
        return
    orjson.dumps(request.chat_body())
    assert all(message["role"] != "system" for message in request.messages[1:])


@FUZZ
@given(json_values)
def test_arbitrary_json_parses_or_raises_invalid_request(body: Any) -> None:
    parses_or_rejects(body)
    parses_or_rejects({"messages": [{"role": "user", "content": [body]}]})


@FUZZ
@given(mutated_requests())
def test_mutated_requests_parse_or_raise_invalid_request(body: Any) -> None:
    parses_or_rejects(body)


@st.composite
def completions(draw: st.DrawFn, *, named_calls: bool = False) -> Completion:
    ids = st.text(
        "abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1 if named_calls else 0, max_size=12
    )
    calls = draw(
        st.lists(
            st.builds(
                ToolCall,
                id=ids,
                name=st.text(min_size=1, max_size=20),
                arguments=tool_arguments.map(lambda a: orjson.dumps(a).decode()),
            ),
            max_size=3,
        )
    )
    return Completion(
        id=draw(st.text("abcdef0123456789-", max_size=10)),
        model="engine",
        content=draw(st.text(max_size=200)),
        reasoning=draw(st.none() | st.text(max_size=200)),
        tool_calls=calls,
        finish_reason=draw(st.sampled_from(FINISH_REASONS)),
        prompt_tokens=draw(st.integers(0, 10**6)),
        completion_tokens=draw(st.integers(0, 10**6)),
    )


def read_frames(frames: list[bytes]) -> list[dict[str, Any]]:
    """Strict SSE reading: one named event and one JSON data line per frame."""
    events = []
    for frame in frames:
        text = frame.decode("utf-8")
        assert text.endswith("\n\n")
        event_line, data_line = text[:-2].split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        data = json.loads(data_line.removeprefix("data: "))
        assert data["type"] == event_line.removeprefix("event: ")
        events.append(data)
    return events


@FUZZ
@given(completions())
def test_stream_frames_replay_the_completion(completion: Completion) -> None:
    events = read_frames(PROVIDER.render_stream(completion, parse_user("hi")))

    assert [e["type"] for e in events[:2]] == ["message_start", "ping"]
    assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"]
    blocks: list[dict[str, Any]] = []
    open_index = None
    for event in events[2:-2]:
        if event["type"] == "content_block_start":
            assert open_index is None and event["index"] == len(blocks)
            open_index = event["index"]
            blocks.append({**event["content_block"], "json": ""})
        elif event["type"] == "content_block_delta":
            assert event["index"] == open_index
            block, delta = blocks[event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                assert delta["type"] == "input_json_delta" and delta["partial_json"]
                block["json"] += delta["partial_json"]
        else:
            assert event["type"] == "content_block_stop" and event["index"] == open_index
            open_index = None
    assert open_index is None

    thinking = [b for b in blocks if b["type"] == "thinking"]
    texts = [b["text"] for b in blocks if b["type"] == "text"]
    tools = [b for b in blocks if b["type"] == "tool_use"]
    if completion.reasoning:
        assert thinking == [
            {
                "type": "thinking",
                "thinking": completion.reasoning,
                "signature": encode_reasoning(completion.reasoning),
                "json": "",
            }
        ]
    else:
        assert thinking == []
    assert "".join(texts) == completion.content
    assert len(texts) <= 1
    assert blocks, "a reply always has at least one block"
    assert [(b["name"], json.loads(b["json"])) for b in tools] == [
        (c.name, json.loads(c.arguments)) for c in completion.tool_calls
    ]
    assert all(
        b["id"] == (c.id or b["id"]) and b["id"]
        for b, c in zip(tools, completion.tool_calls, strict=True)
    )
    assert events[-2]["usage"]["output_tokens"] == completion.completion_tokens


GATEWAY = FakeGateway()
CLIENT = sdk_client(GATEWAY)


@settings(FUZZ, max_examples=100)
@given(completions(named_calls=True))
def test_sdk_stream_and_message_agree_with_the_completion(completion: Completion) -> None:
    GATEWAY.completion = completion
    message = CLIENT.messages.create(**ask())
    with CLIENT.messages.stream(**ask()) as stream:
        streamed = stream.get_final_message()

    for final in (message, streamed):
        blocks = final.content
        thinking = [b.thinking for b in blocks if isinstance(b, ThinkingBlock)]
        text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
        calls = [(b.id, b.name, b.input) for b in blocks if isinstance(b, ToolUseBlock)]
        assert thinking == ([completion.reasoning] if completion.reasoning else [])
        assert text == completion.content
        assert calls == [(c.id, c.name, json.loads(c.arguments)) for c in completion.tool_calls]
        assert final.usage.input_tokens == completion.prompt_tokens
        assert final.usage.output_tokens == completion.completion_tokens
    assert streamed.stop_reason == message.stop_reason
