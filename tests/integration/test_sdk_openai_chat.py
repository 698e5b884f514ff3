"""The official openai SDK (Chat Completions) against the live gateway and scripted engine."""

from __future__ import annotations

import json

import openai
import pytest

from polar.engines.scripted import ScriptedReply
from polar.engines.scripted import logged_tokens as engine_tokens

from .engine_replies import gap_flags

pytestmark = pytest.mark.slow

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def _client(live_gateway, key=None):
    session = live_gateway.new_session()
    return session, openai.OpenAI(
        base_url=session.base_urls["openai"], api_key=key or session.key, max_retries=0
    )


def _assert_faithful(live_gateway, key):
    records = live_gateway.records(key)
    assert len(records) == len(live_gateway.engine_log)
    for record, reply in zip(records, live_gateway.engine_log, strict=True):
        assert (record.prompt_ids, record.sampled_ids, record.logprobs) == engine_tokens(reply)
        assert record.provider == "openai_chat"
        assert gap_flags(record.flags) == []
    return records


def test_non_streaming_tool_round_trip(live_gateway):
    session, client = _client(live_gateway)
    live_gateway.script(
        ScriptedReply(content="Let me look.", tool_calls=[("shell", {"command": "ls -la"})]),
        ScriptedReply(content="There are 3 files."),
    )
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What files?"},
    ]
    first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "shell"
    assert json.loads(call.function.arguments) == {"command": "ls -la"}
    assert first.model == "m"
    assert first.usage.completion_tokens == len(
        live_gateway.engine_log[0]["choices"][0]["token_ids"]
    )
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": [{"type": "text", "text": "a b c"}]},
    ]
    second = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "There are 3 files."
    records = _assert_faithful(live_gateway, session.key)
    # The id the client saw is the id the engine got back in history.
    sent = records[1].upstream_request["messages"]
    assert sent[2]["tool_calls"][0]["id"] == call.id
    assert sent[3] == {"role": "tool", "tool_call_id": call.id, "content": "a b c"}
    # The second prompt extends the first: the assistant turn was re-rendered in place.
    assert records[1].prompt_ids[: len(records[0].prompt_ids)] == records[0].prompt_ids


def test_streaming_with_usage_and_tool_call_arguments_whole(live_gateway):
    session, client = _client(live_gateway)
    live_gateway.script(
        ScriptedReply(
            content="ok",
            tool_calls=[("shell", {"command": "echo 'ü' && ls"}), ("shell", {"command": "pwd"})],
        )
    )
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "go"}],
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    args = [
        tc.function.arguments
        for c in chunks
        for ch in c.choices
        for tc in ch.delta.tool_calls or []
    ]
    assert [json.loads(a) for a in args] == [{"command": "echo 'ü' && ls"}, {"command": "pwd"}]
    assert chunks[-1].usage.completion_tokens == len(
        live_gateway.engine_log[0]["choices"][0]["token_ids"]
    )
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == [
        "tool_calls"
    ]
    _assert_faithful(live_gateway, session.key)


def test_sampling_policy_and_served_model_recorded(live_gateway):
    session, client = _client(live_gateway)
    client.chat.completions.create(
        model="gpt-x", messages=[{"role": "user", "content": "hi"}], temperature=0.2
    )
    record = live_gateway.records(session.key)[0]
    assert record.upstream_request["model"] == "SmolLM2-135M-Instruct"
    assert record.upstream_request["temperature"] == 1.0  # the run's policy overrides the client
    assert record.sampling["temperature"] == 1.0
    assert record.request["temperature"] == 0.2  # the harness's own request is kept verbatim


def test_unknown_key_is_401_in_openai_shape(live_gateway):
    client = openai.OpenAI(base_url=f"{live_gateway.base_url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["type"] == "authentication_error"


def test_engine_error_passes_through_as_openai_error(live_gateway):
    _, client = _client(live_gateway)
    live_gateway.script(ScriptedReply(error_status=400, error_message="context length exceeded"))
    # The engine refused at once: a streamed call keeps the status (headers wait a grace).
    with pytest.raises(openai.BadRequestError) as info:
        list(
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        )
    assert "context length exceeded" in info.value.message


def _chat(client, stream, **kwargs):
    """The reply as (message-like dict, finish_reason), streamed or not."""
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        return choice.message.model_dump(exclude_none=True), choice.finish_reason
    message: dict = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                message["content"] = message.get("content", "") + delta.content
            if delta.function_call:
                message["function_call"] = delta.function_call.model_dump(exclude_none=True)
            if delta.tool_calls:
                message.setdefault("tool_calls", []).extend(delta.tool_calls)
            finish = choice.finish_reason or finish
    return message, finish


@pytest.mark.conformance(feature="assistant refusal in history", api="openai_chat", status="mapped")
@pytest.mark.parametrize("stream", [False, True])
def test_an_assistant_refusal_in_history_is_accepted(live_gateway, stream):
    session, client = _client(live_gateway)
    live_gateway.script(ScriptedReply(content="Fine."))
    message, _ = _chat(
        client,
        stream,
        model="m",
        messages=[
            {"role": "user", "content": "Do it"},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "I won't."}]},
            {"role": "user", "content": "Then say fine"},
        ],
    )
    assert message["content"] == "Fine."
    (record,) = live_gateway.records(session.key)
    assert "feature assistant refusal: mapped" in record.notes
    assert record.upstream_request["messages"][1] == {"role": "assistant", "content": "I won't."}


@pytest.mark.conformance(
    feature="legacy functions / function_call", api="openai_chat", status="mapped"
)
@pytest.mark.parametrize("stream", [False, True])
def test_legacy_functions_round_trip(live_gateway, stream):
    session, client = _client(live_gateway)
    live_gateway.script(
        ScriptedReply(tool_calls=[("shell", {"command": "ls"})]), ScriptedReply(content="a.py")
    )
    kwargs = {"model": "m", "functions": [TOOLS[0]["function"]]}
    messages: list = [{"role": "user", "content": "List"}]
    first, finish = _chat(client, stream, messages=messages, **kwargs)
    assert finish == "function_call"
    assert "tool_calls" not in first
    assert first["function_call"]["name"] == "shell"
    assert json.loads(first["function_call"]["arguments"]) == {"command": "ls"}
    messages += [
        {"role": "assistant", "content": None, "function_call": first["function_call"]},
        {"role": "function", "name": "shell", "content": "a.py"},
    ]
    second, _ = _chat(client, stream, messages=messages, **kwargs)
    assert second["content"] == "a.py"
    records = live_gateway.records(session.key)
    assert "feature legacy functions: mapped" in records[0].notes
    sent = records[1].upstream_request
    assert sent["tools"] == TOOLS
    call_id = sent["messages"][1]["tool_calls"][0]["id"]
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": call_id, "content": "a.py"}


@pytest.mark.conformance(feature="parallel_tool_calls false", api="openai_chat", status="supported")
@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_gives_one_call(noncanonical_gateway, stream):
    gateway = noncanonical_gateway
    gateway.reset()
    session, client = _client(gateway)
    gateway.script(
        ScriptedReply(tool_calls=[("shell", {"command": "ls"}), ("shell", {"command": "pwd"})])
    )
    message, finish = _chat(
        client,
        stream,
        model="m",
        tools=TOOLS,
        parallel_tool_calls=False,
        messages=[{"role": "user", "content": "List"}],
    )
    assert finish == "tool_calls" and len(message["tool_calls"]) == 1
    (record,) = gateway.records(session.key)
    assert "feature parallel_tool_calls: honoured" in record.notes
    if gateway.render_mode == "engine":
        assert record.upstream_request["parallel_tool_calls"] is False
    else:  # the gateway parsed both sampled calls and kept the first, as vLLM does
        assert "parallel_tool_calls_kept_first" in record.flags
    # The sampled ids are the engine's, whole.
    assert record.sampled_ids == gateway.engine_log[-1]["choices"][0]["token_ids"]
    gateway.reset()


@pytest.mark.conformance(feature="logprobs", api="openai_chat", status="supported")
@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_are_the_captured_ones(noncanonical_gateway, stream):
    gateway = noncanonical_gateway
    gateway.reset()
    session, client = _client(gateway)
    gateway.script(ScriptedReply(content="Hello there."))
    kwargs = {"model": "m", "logprobs": True, "messages": [{"role": "user", "content": "Hi"}]}
    if stream:
        entries = [
            entry
            for chunk in client.chat.completions.create(stream=True, **kwargs)
            for choice in chunk.choices
            if choice.logprobs is not None
            for entry in choice.logprobs.content or []
        ]
    else:
        entries = client.chat.completions.create(**kwargs).choices[0].logprobs.content
    (record,) = gateway.records(session.key)
    assert [e.logprob for e in entries] == record.logprobs
    assert "Hello" in "".join(e.token for e in entries)
    assert "feature logprobs: honoured" in record.notes
    gateway.reset()


@pytest.mark.conformance(feature="top_logprobs", api="openai_chat", status="refused")
def test_top_logprobs_are_refused_by_name(live_gateway):
    _, client = _client(live_gateway)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(
            model="m", logprobs=True, top_logprobs=3, messages=[{"role": "user", "content": "Hi"}]
        )
    assert live_gateway.engine_log == []
