"""The official anthropic SDK against the live gateway and scripted engine."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from polar.engines.scripted import ScriptedReply
from polar.engines.scripted import logged_tokens as engine_tokens

pytestmark = pytest.mark.slow

TOOLS = [
    {
        "name": "bash",
        "description": "Run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
]


def _assert_faithful(live_gateway, key):
    records = live_gateway.records(key)
    assert len(records) == len(live_gateway.engine_log) > 0
    for record, reply in zip(records, live_gateway.engine_log, strict=True):
        assert record.provider == "anthropic"
        assert (record.prompt_ids, record.sampled_ids, record.logprobs) == engine_tokens(reply)
    return records


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_round_trip(live_gateway, stream):
    session = live_gateway.new_session()
    client = anthropic.Anthropic(
        base_url=session.base_urls["anthropic"], api_key=session.key, max_retries=0
    )
    live_gateway.script(
        ScriptedReply(
            content="I'll list.", reasoning="need ls", tool_calls=[("bash", {"command": "ls -1"})]
        ),
        ScriptedReply(content="Found a.txt."),
    )
    messages: list = [{"role": "user", "content": "List files"}]
    kwargs = {
        "model": "claude-x",
        "max_tokens": 8000,
        "system": "You are Claude Code.",
        "tools": TOOLS,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    if stream:
        with client.messages.stream(messages=messages, **kwargs) as s:
            first = s.get_final_message()
    else:
        first = client.messages.create(messages=messages, **kwargs)
    assert first.stop_reason == "tool_use"
    kinds = [b.type for b in first.content]
    assert kinds == ["thinking", "text", "tool_use"]
    tool_use = first.content[2]
    assert tool_use.input == {"command": "ls -1"}
    assert first.usage.output_tokens == len(live_gateway.engine_log[0]["choices"][0]["token_ids"])
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": tool_use.id,
                    "content": [{"type": "text", "text": "a.txt"}],
                }
            ],
        },
    ]
    second = client.messages.create(messages=messages, **kwargs)
    assert second.content[-1].text == "Found a.txt."
    records = _assert_faithful(live_gateway, session.key)
    sent = records[1].upstream_request["messages"]
    assert sent[0] == {"role": "system", "content": "You are Claude Code."}
    assert sent[2]["tool_calls"][0]["id"] == tool_use.id
    assert sent[2]["reasoning"] == "need ls"  # recovered from our synthetic signature
    assert sent[3] == {"role": "tool", "tool_call_id": tool_use.id, "content": "a.txt"}
    assert records[1].prompt_ids[: len(records[0].prompt_ids)] == records[0].prompt_ids


def test_claude_code_style_request_routes_by_x_api_key(live_gateway):
    session = live_gateway.new_session()
    body = {
        "model": "claude-sonnet",
        "max_tokens": 100,
        "stream": True,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc"},
            {"type": "text", "text": "You are Claude Code."},
        ],
        "messages": [
            {"role": "system", "content": "Extra rules."},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
    }
    reply = httpx.post(
        f"{live_gateway.base_url}/v1/messages?beta=true",
        json=body,
        headers={"x-api-key": session.key, "anthropic-version": "2023-06-01"},
    )
    assert reply.status_code == 200
    events = [
        line.split(": ", 1)[1] for line in reply.text.splitlines() if line.startswith("event: ")
    ]
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]
    assert events.count("content_block_start") == events.count("content_block_stop") >= 1
    [record] = live_gateway.records(session.key)
    assert record.notes == ["stripped: x-anthropic-billing-header: cc_version=1; cch=abc"]
    assert record.upstream_request["messages"][0] == {
        "role": "system",
        "content": "You are Claude Code.\nExtra rules.",
    }


def test_count_tokens_uses_the_engine_tokenizer(live_gateway):
    session = live_gateway.new_session()
    client = anthropic.Anthropic(
        base_url=session.base_urls["anthropic"], api_key=session.key, max_retries=0
    )
    count = client.messages.count_tokens(
        model="m", messages=[{"role": "user", "content": "hello there"}]
    )
    ids = live_gateway.engine.backend.prompt_ids([{"role": "user", "content": "hello there"}], None)
    assert count.input_tokens == len(ids)


def test_unknown_key_raises_authentication_error(live_gateway):
    client = anthropic.Anthropic(base_url=live_gateway.base_url, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        client.messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )


@pytest.mark.conformance(
    feature="matched stop sequence reported", api="anthropic", status="supported"
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_matched_stop_sequence_is_reported_as_the_api_does(live_gateway, stream):
    session = live_gateway.new_session()
    client = anthropic.Anthropic(
        base_url=session.base_urls["anthropic"], api_key=session.key, max_retries=0
    )
    live_gateway.script(ScriptedReply(content="Answer: 42\nObservation: more text"))
    kwargs = {
        "model": "claude-x",
        "max_tokens": 200,
        "stop_sequences": ["Observation:"],
        "messages": [{"role": "user", "content": "Compute"}],
    }
    if stream:
        with client.messages.stream(**kwargs) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    assert message.stop_reason == "stop_sequence"
    assert message.stop_sequence == "Observation:"
    assert message.content[0].text == "Answer: 42\n"
    (record,) = live_gateway.records(session.key)
    # The sampled ids run through the stop string, exactly as the engine returned them.
    assert record.sampled_ids == live_gateway.engine_log[-1]["choices"][0]["token_ids"]


def _anthropic(session):
    return anthropic.Anthropic(
        base_url=session.base_urls["anthropic"], api_key=session.key, max_retries=0
    )


def _create(client, stream, **kwargs):
    if stream:
        with client.messages.stream(**kwargs) as events:
            return events.get_final_message()
    return client.messages.create(**kwargs)


@pytest.mark.conformance(
    feature="client schema tools (bash, text_editor)", api="anthropic", status="mapped"
)
@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_schema_tools_are_callable_under_their_names(live_gateway, stream):
    session = live_gateway.new_session()
    edit = {"command": "str_replace", "path": "/a.py", "old_str": "x", "new_str": "y"}
    live_gateway.script(ScriptedReply(tool_calls=[("str_replace_based_edit_tool", edit)]))
    message = _create(
        _anthropic(session),
        stream,
        model="claude-x",
        max_tokens=200,
        tools=[
            {"type": "bash_20250124", "name": "bash"},
            {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
        ],
        messages=[{"role": "user", "content": "Fix a.py"}],
    )
    assert message.stop_reason == "tool_use"
    (call,) = [b for b in message.content if b.type == "tool_use"]
    assert (call.name, call.input) == ("str_replace_based_edit_tool", edit)
    (record,) = _assert_faithful(live_gateway, session.key)
    assert "feature tool bash_20250124: mapped" in record.notes
    assert "feature tool text_editor_20250728: mapped" in record.notes
    # The engine saw both tools as function tools with Anthropic's input schemas.
    prompt = live_gateway.engine.backend.tokenizer.decode(record.prompt_ids)
    assert '"name": "bash"' in prompt and '"restart"' in prompt
    assert '"name": "str_replace_based_edit_tool"' in prompt and '"view_range"' in prompt


@pytest.mark.conformance(
    feature="server tools (web_search, ...)", api="anthropic", status="refused"
)
@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_server_tools_are_refused_naming_the_tool(live_gateway, stream):
    session = live_gateway.new_session()
    with pytest.raises(anthropic.BadRequestError, match="web_search_20250305"):
        _create(
            _anthropic(session),
            stream,
            model="claude-x",
            max_tokens=200,
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
            messages=[{"role": "user", "content": "Search"}],
        )
    assert live_gateway.engine_log == []


@pytest.mark.conformance(feature="assistant prefill", api="anthropic", status="supported")
@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_assistant_prefill_is_continued(noncanonical_gateway, stream):
    gateway = noncanonical_gateway
    gateway.reset()
    session = gateway.new_session()
    gateway.script(ScriptedReply(content=' "blue"}'))
    message = _create(
        _anthropic(session),
        stream,
        model="claude-x",
        max_tokens=200,
        messages=[
            {"role": "user", "content": "Your favourite colour, as JSON"},
            {"role": "assistant", "content": '{"colour":'},
        ],
    )
    # As Anthropic does: the reply holds only the continuation of the prefill.
    assert message.content[0].text == ' "blue"}'
    (record,) = gateway.records(session.key)
    assert "feature assistant prefill: honoured" in record.notes
    # The engine saw the prefill as the open start of the assistant turn.
    prompt = gateway.engine.backend.tokenizer.decode(record.prompt_ids)
    assert prompt.endswith('<|im_start|>assistant\n{"colour":')
    gateway.reset()


@pytest.mark.conformance(feature="disable_parallel_tool_use", api="anthropic", status="mapped")
@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_disable_parallel_tool_use_gives_one_call(noncanonical_gateway, stream):
    gateway = noncanonical_gateway
    gateway.reset()
    session = gateway.new_session()
    gateway.script(
        ScriptedReply(tool_calls=[("bash", {"command": "ls"}), ("bash", {"command": "pwd"})])
    )
    message = _create(
        _anthropic(session),
        stream,
        model="claude-x",
        max_tokens=200,
        tools=TOOLS,
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        messages=[{"role": "user", "content": "List"}],
    )
    assert [b.type for b in message.content] == ["tool_use"]
    (record,) = gateway.records(session.key)
    assert "feature disable_parallel_tool_use: mapped" in record.notes
    if gateway.render_mode == "engine":
        assert record.upstream_request["parallel_tool_calls"] is False
    else:
        assert "parallel_tool_calls_kept_first" in record.flags
    gateway.reset()


@pytest.mark.conformance(feature="text documents", api="anthropic", status="mapped")
@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_text_documents_reach_the_model(live_gateway, stream):
    session = live_gateway.new_session()
    live_gateway.script(ScriptedReply(content="It says hello."))
    message = _create(
        _anthropic(session),
        stream,
        model="claude-x",
        max_tokens=200,
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "document",
                        "source": {"type": "text", "media_type": "text/plain", "data": "hello"},
                    },
                    {"type": "text", "text": "What does it say?"},
                ],
            }
        ],
    )
    assert message.content[0].text == "It says hello."
    (record,) = live_gateway.records(session.key)
    assert "feature text documents: mapped" in record.notes
    assert record.upstream_request["messages"][0]["content"] == "hello\nWhat does it say?"


@pytest.mark.conformance(feature="PDF documents", api="anthropic", status="refused")
@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_pdf_documents_are_refused(live_gateway, stream):
    session = live_gateway.new_session()
    pdf = {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQK"}
    with pytest.raises(anthropic.BadRequestError, match="PDF documents"):
        _create(
            _anthropic(session),
            stream,
            model="claude-x",
            max_tokens=200,
            messages=[{"role": "user", "content": [{"type": "document", "source": pdf}]}],
        )
    assert live_gateway.engine_log == []
