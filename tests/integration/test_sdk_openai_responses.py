"""The official openai SDK (Responses API, as Codex speaks it) against the live gateway."""

from __future__ import annotations

import json

import openai
import pytest

from polar.engines.scripted import ScriptedReply
from polar.engines.scripted import logged_tokens as engine_tokens

pytestmark = pytest.mark.slow

TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "description": "Run a command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        },
    },
]


@pytest.mark.parametrize("stream", [False, True])
def test_function_call_round_trip(live_gateway, stream):
    session = live_gateway.new_session()
    client = openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key, max_retries=0)
    live_gateway.script(
        ScriptedReply(content="", reasoning="run ls", tool_calls=[("shell", {"command": ["ls"]})]),
        ScriptedReply(content="Done: a.txt"),
    )
    kwargs = {
        "model": "gpt-5-codex",
        "instructions": "You are Codex.",
        "tools": TOOLS,
        "include": ["reasoning.encrypted_content"],
        "store": False,
    }
    items: list = [{"role": "user", "content": [{"type": "input_text", "text": "list files"}]}]
    if stream:
        with client.responses.stream(input=items, **kwargs) as s:
            events = [e.type for e in s]
            first = s.get_final_response()
        assert events[-1] == "response.completed"
        assert "response.function_call_arguments.done" in events
    else:
        first = client.responses.create(input=items, **kwargs)
    calls = [o for o in first.output if o.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("shell", {"command": ["ls"]})]
    reasoning = [o for o in first.output if o.type == "reasoning"]
    assert reasoning and reasoning[0].encrypted_content
    items += [o.model_dump(exclude_none=True) for o in first.output]
    items.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": "a.txt"})
    second = client.responses.create(input=items, **kwargs)
    assert second.output_text == "Done: a.txt"
    records = live_gateway.records(session.key)
    for record, reply in zip(records, live_gateway.engine_log, strict=True):
        assert (record.prompt_ids, record.sampled_ids, record.logprobs) == engine_tokens(reply)
    sent = records[1].upstream_request["messages"]
    assert sent[0] == {"role": "system", "content": "You are Codex."}
    assistant = sent[2]
    assert assistant["reasoning"] == "run ls"
    assert assistant["tool_calls"][0]["id"] == calls[0].call_id
    assert sent[3] == {"role": "tool", "tool_call_id": calls[0].call_id, "content": "a.txt"}


@pytest.mark.conformance(
    feature="parallel_tool_calls false", api="openai_responses", status="supported"
)
@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_gives_one_call(noncanonical_gateway, stream):
    gateway = noncanonical_gateway
    gateway.reset()
    session = gateway.new_session()
    client = openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key, max_retries=0)
    gateway.script(
        ScriptedReply(tool_calls=[("shell", {"command": ["ls"]}), ("shell", {"command": ["pwd"]})])
    )
    kwargs = {
        "model": "gpt-5-codex",
        "tools": TOOLS[:1],
        "parallel_tool_calls": False,
        "input": "list files",
    }
    if stream:
        with client.responses.stream(**kwargs) as events:
            response = events.get_final_response()
    else:
        response = client.responses.create(**kwargs)
    assert [item.type for item in response.output] == ["function_call"]
    (record,) = gateway.records(session.key)
    assert "feature parallel_tool_calls: honoured" in record.notes
    if gateway.render_mode == "engine":
        assert record.upstream_request["parallel_tool_calls"] is False
    else:
        assert "parallel_tool_calls_kept_first" in record.flags
    gateway.reset()


@pytest.mark.conformance(feature="logprobs", api="openai_responses", status="supported")
@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_are_the_captured_ones(noncanonical_gateway, stream):
    gateway = noncanonical_gateway
    gateway.reset()
    session = gateway.new_session()
    client = openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key, max_retries=0)
    gateway.script(ScriptedReply(content="Hello there."))
    kwargs = {"model": "m", "input": "Hi", "include": ["message.output_text.logprobs"]}
    if stream:
        with client.responses.stream(**kwargs) as events:
            response = events.get_final_response()
    else:
        response = client.responses.create(**kwargs)
    entries = response.output[0].content[0].logprobs
    (record,) = gateway.records(session.key)
    assert [e.logprob for e in entries] == record.logprobs
    assert "feature logprobs: honoured" in record.notes
    gateway.reset()


@pytest.mark.conformance(feature="top_logprobs", api="openai_responses", status="refused")
def test_top_logprobs_are_refused_by_name(live_gateway):
    session = live_gateway.new_session()
    client = openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.responses.create(model="m", input="Hi", top_logprobs=2)
    assert live_gateway.engine_log == []
