from __future__ import annotations

import contextlib
import json

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.errors import AuthenticationFailed, EngineUnavailable, GatewayError, InvalidRequest
from polar.providers.base import RequestContext
from polar.providers.openai_chat import ChatState, OpenAIChatProvider
from polar.providers.types import Completion, ToolCall

P = OpenAIChatProvider()
CTX = RequestContext(path="/v1/chat/completions")


def test_operation_by_suffix():
    assert P.operation(RequestContext(path="/api/v1/chat/completions")) == "generate"
    assert P.operation(RequestContext(path="/v1/responses")) is None


def test_qwen_style_history_normalizes():
    body = {
        "model": "qwen",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "You are Qwen Code."}]},
            {"role": "developer", "content": "Be careful."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "fix"}, {"type": "text", "text": "the bug"}],
            },
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "think",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "sh", "arguments": '{"cmd":"ls"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a.py"}]},
        ],
        "tools": [
            {"type": "function", "function": {"name": "sh", "parameters": {"type": "object"}}},
        ],
        "tool_choice": "auto",
        "max_tokens": 8000,
        "stop": "END",
        "top_k": 20,
    }
    req = P.parse_request(body, CTX)
    assert req.messages == [
        {"role": "system", "content": "You are Qwen Code.\nBe careful."},
        {"role": "user", "content": "fix\nthe bug"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "sh", "arguments": '{"cmd":"ls"}'},
                }
            ],
            "reasoning": "think",
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    ]
    assert req.tools == [
        {"type": "function", "function": {"name": "sh", "parameters": {"type": "object"}}}
    ]
    assert req.dropped_tools == []
    assert (req.params.max_tokens, req.params.stop, req.params.top_k) == (8000, ["END"], 20)
    assert req.stream and req.adapter_state == ChatState(include_usage=True)
    assert req.chat_body()["tool_choice"] == "auto"


def test_tool_choice_not_sent_without_tools():
    req = P.parse_request(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}, CTX
    )
    assert "tool_choice" not in req.chat_body()


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "audio"}]}]},
        {"messages": [{"role": "user", "content": "x"}], "n": 2},
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5},
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2**70},
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
        {"messages": [{"role": "user", "content": "x"}], "temperature": -1},
        {"messages": [{"role": "user", "content": "x"}], "top_p": 1.5},
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
    ],
)
def test_invalid_bodies(body):
    with pytest.raises(InvalidRequest):
        P.parse_request(body, CTX)


@pytest.mark.parametrize("role", ["system", "tool"])
def test_an_image_outside_a_user_message_is_refused_by_name_not_turned_into_text(role):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    message = {"role": role, "content": [image], "tool_call_id": "c1"}
    with pytest.raises(InvalidRequest, match="images are supported in user messages only"):
        P.parse_request({"messages": [message, {"role": "user", "content": "x"}]}, CTX)


def _completion() -> Completion:
    return Completion(
        id="chatcmpl-1",
        model="engine",
        content="Hi ü",
        reasoning="hmm",
        tool_calls=[ToolCall(id="call_1", name="sh", arguments='{"cmd": "ls -la"}')],
        finish_reason="tool_calls",
        prompt_tokens=10,
        completion_tokens=7,
        created=1,
    )


def _sdk(handler) -> openai.OpenAI:
    return openai.OpenAI(
        api_key="k",
        base_url="http://gw/v1",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )


def _serve(request: httpx.Request) -> httpx.Response:
    req = P.parse_request(json.loads(request.content), CTX)
    if req.stream:
        return httpx.Response(
            200,
            content=b"".join(P.render_stream(_completion(), req)),
            headers={"content-type": "text/event-stream"},
        )
    return httpx.Response(200, json=P.render_response(_completion(), req))


def test_sdk_parses_reply_and_stream():
    client = _sdk(_serve)
    reply = client.chat.completions.create(
        model="asked", messages=[{"role": "user", "content": "x"}]
    )
    assert reply.model == "asked"
    assert reply.choices[0].message.content == "Hi ü"
    assert reply.choices[0].message.tool_calls[0].function.arguments == '{"cmd": "ls -la"}'
    assert reply.usage.total_tokens == 17
    chunks = list(
        client.chat.completions.create(
            model="asked",
            messages=[{"role": "user", "content": "x"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    calls = [tc for c in chunks for ch in c.choices for tc in ch.delta.tool_calls or []]
    assert text == "Hi ü"
    assert [(tc.id, tc.function.name, tc.function.arguments) for tc in calls] == [
        ("call_1", "sh", '{"cmd": "ls -la"}')
    ]
    assert chunks[-1].usage.completion_tokens == 7


@pytest.mark.parametrize(
    ("error", "exc"),
    [
        (InvalidRequest("bad field"), openai.BadRequestError),
        (AuthenticationFailed("unknown session key"), openai.AuthenticationError),
        (EngineUnavailable("down"), openai.InternalServerError),
    ],
)
def test_sdk_raises_typed_errors(error: GatewayError, exc: type[Exception]):
    client = _sdk(lambda request: httpx.Response(error.status, json=P.error_body(error)))
    with pytest.raises(exc) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert error.message in str(info.value)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=20,
)
keys = st.sampled_from(
    [
        "messages",
        "tools",
        "tool_choice",
        "max_tokens",
        "stop",
        "temperature",
        "n",
        "role",
        "content",
        "tool_calls",
        "function",
    ]
)


@settings(max_examples=200, deadline=None)
@given(st.one_of(json_values, st.dictionaries(keys, json_values, max_size=6)))
def test_fuzz_parse_never_crashes(body):
    with contextlib.suppress(InvalidRequest):
        P.parse_request(body, CTX)


@settings(max_examples=100, deadline=None)
@given(
    st.text(max_size=40),
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=10),
            st.dictionaries(st.text(max_size=5), json_values, max_size=3),
        ),
        max_size=3,
    ),
)
def test_fuzz_stream_frames_replay_the_completion(content, calls):
    completion = Completion(
        id="x",
        model="m",
        content=content,
        tool_calls=[
            ToolCall(id=f"c{i}", name=n, arguments=json.dumps(a)) for i, (n, a) in enumerate(calls)
        ],
        finish_reason="tool_calls" if calls else "stop",
    )
    req = P.parse_request({"messages": [{"role": "user", "content": "x"}], "stream": True}, CTX)
    frames = P.render_stream(completion, req)
    assert frames[-1] == b"data: [DONE]\n\n"
    events = [json.loads(f[6:]) for f in frames[:-1]]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == content
    got = [
        tc["function"]["arguments"]
        for e in events
        for tc in e["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert [json.loads(a) for a in got] == [a for _, a in calls]


@pytest.mark.parametrize(
    "change", [{"stream": "yes"}, {"model": [1, 2]}], ids=["stream-not-bool", "model-not-str"]
)
def test_wrongly_typed_fields_are_refused_as_the_provider_does(change: dict) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **change}
    with pytest.raises(InvalidRequest):
        OpenAIChatProvider().parse_request(body, RequestContext(path="/v1/chat/completions"))


def test_an_assistant_refusal_is_kept_as_text():
    req = P.parse_request(
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]},
                {"role": "assistant", "content": "Well", "refusal": "No."},
                {"role": "user", "content": "y"},
            ]
        },
        CTX,
    )
    assert [m["content"] for m in req.messages[1:3]] == ["I can't.", "Well\nNo."]
    assert req.capture.features == {"assistant refusal": "mapped"}


LEGACY_FUNCTIONS = [{"name": "sh", "parameters": {"type": "object"}}]


def test_legacy_functions_map_to_tools_and_history():
    req = P.parse_request(
        {
            "functions": LEGACY_FUNCTIONS,
            "function_call": {"name": "sh"},
            "messages": [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "content": None,
                    "function_call": {"name": "sh", "arguments": "{}"},
                },
                {"role": "function", "name": "sh", "content": "a.py"},
            ],
        },
        CTX,
    )
    call_id = req.messages[1]["tool_calls"][0]["id"]
    assert req.messages[1]["tool_calls"][0]["function"] == {"name": "sh", "arguments": "{}"}
    assert req.messages[2] == {"role": "tool", "tool_call_id": call_id, "content": "a.py"}
    body = req.chat_body()
    assert body["tools"] == [{"type": "function", "function": LEGACY_FUNCTIONS[0]}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "sh"}}
    assert body["parallel_tool_calls"] is False
    assert req.capture.features == {
        "legacy functions": "mapped",
        "legacy function messages": "mapped",
    }


def test_legacy_functions_are_answered_in_the_legacy_shape():
    client = _sdk(_serve)
    kwargs = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "functions": LEGACY_FUNCTIONS,
    }
    reply = client.chat.completions.create(**kwargs)
    choice = reply.choices[0]
    assert choice.finish_reason == "function_call"
    assert choice.message.tool_calls is None
    assert (choice.message.function_call.name, choice.message.function_call.arguments) == (
        "sh",
        '{"cmd": "ls -la"}',
    )
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    deltas = [ch.delta for c in chunks for ch in c.choices]
    assert [d.function_call.name for d in deltas if d.function_call] == ["sh"]
    assert not any(d.tool_calls for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "function_call"


def test_parallel_tool_calls_false_is_forwarded():
    tools = [{"type": "function", "function": LEGACY_FUNCTIONS[0]}]
    req = P.parse_request(
        {
            "messages": [{"role": "user", "content": "x"}],
            "tools": tools,
            "parallel_tool_calls": False,
        },
        CTX,
    )
    assert req.chat_body()["parallel_tool_calls"] is False
    assert req.capture.features == {"parallel_tool_calls": "honoured"}
    with pytest.raises(InvalidRequest):
        P.parse_request(
            {"messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": "no"}, CTX
        )


def test_logprobs_asked_are_rendered_and_top_logprobs_refused():
    from polar.providers.types import TokenLogprob

    req = P.parse_request({"messages": [{"role": "user", "content": "x"}], "logprobs": True}, CTX)
    assert req.logprobs and req.capture.features == {"logprobs": "honoured"}
    completion = _completion()
    completion.logprobs = [TokenLogprob("Hi", -0.5), TokenLogprob(" ü", -1.0)]
    content = P.render_response(completion, req)["choices"][0]["logprobs"]["content"]
    assert [(e["token"], e["logprob"], e["bytes"]) for e in content] == [
        ("Hi", -0.5, [72, 105]),
        (" ü", -1.0, [32, 195, 188]),
    ]
    plain = P.parse_request({"messages": [{"role": "user", "content": "x"}]}, CTX)
    assert P.render_response(completion, plain)["choices"][0]["logprobs"] is None
    with pytest.raises(InvalidRequest, match="top_logprobs"):
        P.parse_request(
            {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 2},
            CTX,
        )
