"""Property tests: any JSON is parsed or refused with InvalidRequest; any completion renders to
frames that parse back (ours and the official SDK's reader) to the same content and arguments."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import httpx
import orjson
from google import genai
from google.genai import types
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.errors import InvalidRequest
from polar.providers.base import RequestContext
from polar.providers.google import GoogleProvider
from polar.providers.reasoning_codec import decode_reasoning, encode_reasoning
from polar.providers.types import Completion, ToolCall

PROVIDER = GoogleProvider()
PATHS = st.sampled_from(
    [
        "/v1beta/models/m:generateContent",
        "/v1beta/models/m:streamGenerateContent",
        "/v1beta/models/m:countTokens",
        "/unclaimed",
    ]
)
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)  # what the gateway's JSON loader yields as ints
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["user", "model", "OBJECT", "ANY", "text", "functionCall", ""])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "contents",
                    "parts",
                    "role",
                    "text",
                    "thought",
                    "functionCall",
                    "functionResponse",
                    "name",
                    "args",
                    "id",
                    "response",
                    "tools",
                    "functionDeclarations",
                    "parameters",
                    "type",
                    "properties",
                    "items",
                    "systemInstruction",
                    "generationConfig",
                    "toolConfig",
                    "inlineData",
                    "fileData",
                    "thoughtSignature",
                    "x",
                ]
            )
            | st.text(max_size=6),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)

VALID_BODY: dict[str, Any] = {
    "systemInstruction": {"parts": [{"text": "sys"}]},
    "contents": [
        {
            "role": "user",
            "parts": [{"text": "hi"}, {"inlineData": {"mimeType": "a/b", "data": "x"}}],
        },
        {
            "role": "model",
            "parts": [
                {"text": "t", "thought": True},
                {
                    "functionCall": {"name": "f", "args": {"a": [1, {"b": None}]}},
                    "thoughtSignature": base64.b64encode(encode_reasoning("r").encode()).decode(),
                },
            ],
        },
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"o": 1}}}]},
    ],
    "tools": [
        {
            "functionDeclarations": [
                {
                    "name": "f",
                    "parameters": {"type": "OBJECT", "properties": {"a": {"type": "ARRAY"}}},
                },
                {"name": "g", "parametersJsonSchema": {"type": "object"}},
            ]
        },
    ],
    "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}},
    "generationConfig": {
        "temperature": 0.5,
        "topK": 3,
        "stopSequences": ["x"],
        "thinkingConfig": {"includeThoughts": True},
    },
}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location inside a JSON value, as key/index paths."""
    found = [prefix]
    if isinstance(value, dict):
        for key, sub in value.items():
            found.extend(_paths(sub, (*prefix, key)))
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            found.extend(_paths(sub, (*prefix, index)))
    return found


@st.composite
def mutated_bodies(draw: st.DrawFn) -> Any:
    body = copy.deepcopy(VALID_BODY)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(body)))
        if not path:
            return draw(json_values)
        parent = body
        for step in path[:-1]:
            parent = parent[step]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(json_values)
    return body


def _parse_or_refuse(body: Any, path: str) -> None:
    try:
        request = PROVIDER.parse_request(body, RequestContext(path=path))
    except InvalidRequest:
        return
    json.dumps(request.chat_body())  # what goes to the engine is plain JSON


@SETTINGS
@given(json_values, PATHS)
def test_arbitrary_json_parses_or_raises_invalid_request(body: Any, path: str) -> None:
    _parse_or_refuse(body, path)


@SETTINGS
@given(mutated_bodies(), PATHS)
def test_mutated_valid_requests_parse_or_raise_invalid_request(body: Any, path: str) -> None:
    _parse_or_refuse(body, path)


json_objects = st.dictionaries(
    st.text(max_size=8),
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**63 - 1)
        | st.text(max_size=10)
        | st.floats(allow_nan=False, allow_infinity=False),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
        ),
        max_leaves=10,
    ),
    max_size=4,
)
tool_calls = st.lists(
    st.builds(
        lambda i, name, args: ToolCall(id=f"call_{i}", name=name, arguments=json.dumps(args)),
        st.integers(0, 10**6),
        st.text(min_size=1, max_size=10),
        json_objects,
    ),
    max_size=3,
)
completions = st.builds(
    Completion,
    id=st.text(min_size=1, max_size=10),
    model=st.just("engine"),
    content=st.text(),
    reasoning=st.none() | st.text(min_size=1),
    tool_calls=tool_calls,
    finish_reason=st.sampled_from(["stop", "length", "tool_calls", "content_filter"]),
    prompt_tokens=st.integers(0, 10**6),
    completion_tokens=st.integers(0, 10**6),
)


def _request(include_thoughts: bool) -> Any:
    body = {
        "contents": [{"parts": [{"text": "hi"}]}],
        "generationConfig": {"thinkingConfig": {"includeThoughts": include_thoughts}},
    }
    return PROVIDER.parse_request(
        body, RequestContext(path="/v1beta/models/m:streamGenerateContent")
    )


def _check_parts(parts: list[dict[str, Any]], completion: Completion, thoughts: bool) -> None:
    texts = [p["text"] for p in parts if "text" in p and not p.get("thought")]
    assert "".join(texts) == completion.content
    calls = [p["functionCall"] for p in parts if "functionCall" in p]
    assert [(c["id"], c["name"], c["args"]) for c in calls] == [
        (t.id, t.name, json.loads(t.arguments)) for t in completion.tool_calls
    ]
    shown = [p["text"] for p in parts if p.get("thought")]
    assert shown == ([completion.reasoning] if thoughts and completion.reasoning else [])
    signed = [
        decode_reasoning(base64.b64decode(p["thoughtSignature"]).decode())
        for p in parts
        if "thoughtSignature" in p
    ]
    assert signed == ([completion.reasoning] if completion.reasoning else [])


@SETTINGS
@given(completions, st.booleans())
def test_stream_frames_are_sse_that_parse_back(completion: Completion, thoughts: bool) -> None:
    request = _request(thoughts)
    frames = PROVIDER.render_stream(completion, request)
    chunks = []
    for frame in frames:
        assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
        assert b"\n" not in frame[:-2]
        chunks.append(orjson.loads(frame[len(b"data: ") : -2]))
    parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
    _check_parts(parts, completion, thoughts)
    assert ["finishReason" in c["candidates"][0] for c in chunks] == [False] * (len(chunks) - 1) + [
        True
    ]
    usage = chunks[-1]["usageMetadata"]
    assert usage["totalTokenCount"] == completion.prompt_tokens + completion.completion_tokens
    # The non-streaming reply holds the same parts in the same order.
    reply = PROVIDER.render_response(completion, request)
    assert reply["candidates"][0]["content"]["parts"] == parts


class _Replay:
    """An httpx handler that answers whatever the current example rendered."""

    body = b""

    def __call__(self, _: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=self.body, headers={"content-type": "text/event-stream"})


REPLAY = _Replay()
CLIENT = genai.Client(
    api_key="k",
    http_options=types.HttpOptions(
        base_url="http://gateway", httpx_client=httpx.Client(transport=httpx.MockTransport(REPLAY))
    ),
)


@settings(max_examples=60, deadline=None)
@given(completions)
def test_official_sdk_reads_any_stream_back(completion: Completion) -> None:
    REPLAY.body = b"".join(PROVIDER.render_stream(completion, _request(True)))
    chunks = list(CLIENT.models.generate_content_stream(model="m", contents="hi"))
    parts = [p for c in chunks for p in ((c.candidates or [])[0].content.parts or [])]  # type: ignore[union-attr]
    assert "".join(p.text or "" for p in parts if not p.thought) == completion.content
    calls = [p.function_call for p in parts if p.function_call]
    assert [(c.id, c.name, c.args) for c in calls] == [
        (t.id, t.name, json.loads(t.arguments)) for t in completion.tool_calls
    ]
    signatures = [p.thought_signature for p in parts if p.thought_signature]
    expected = [encode_reasoning(completion.reasoning).encode()] if completion.reasoning else []
    assert signatures == expected
