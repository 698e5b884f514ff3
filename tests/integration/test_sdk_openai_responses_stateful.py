"""Stateful Responses with the official openai SDK through a live gateway: previous_response_id
continues a stored response exactly, retrieve and delete work per session, conversation is
refused by name."""

from __future__ import annotations

import itertools
import json
from typing import Any

import openai
import pytest

from polar.engines.scripted import ScriptedReply
from polar.engines.scripted import logged_tokens as engine_tokens
from polar.trajectory.registry import create_builder

pytestmark = pytest.mark.slow

API = "openai_responses"
TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "description": "Run a command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        },
    }
]


def client_for(gateway: Any) -> tuple[Any, openai.OpenAI]:
    session = gateway.new_session()
    client = openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key, max_retries=0)
    return session, client


def create(client: openai.OpenAI, stream: bool, **kwargs: Any) -> Any:
    if not stream:
        return client.responses.create(**kwargs)
    events = list(client.responses.create(stream=True, **kwargs))
    assert events[-1].type == "response.completed"
    return events[-1].response  # the Response object exactly as the gateway sent it


@pytest.mark.conformance(feature="previous_response_id", api=API, status="supported")
@pytest.mark.parametrize("stream", [False, True])
def test_previous_response_id_continues_the_stored_conversation(
    noncanonical_gateway, tokenizer, stream
):
    gateway = noncanonical_gateway
    gateway.reset()
    session, client = client_for(gateway)
    gateway.script(
        ScriptedReply(content="", reasoning="run ls", tool_calls=[("shell", {"command": ["ls"]})]),
        ScriptedReply(content="Done: a.txt"),
        ScriptedReply(content="Two files."),
    )
    common = {"model": "gpt-5-codex", "instructions": "You are Codex.", "tools": TOOLS}
    first = create(client, stream, input="list files", **common)
    call = next(o for o in first.output if o.type == "function_call")
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"}
    second = create(client, stream, input=[output], previous_response_id=first.id, **common)
    assert second.output_text == "Done: a.txt"
    assert second.previous_response_id == first.id
    third = create(client, stream, input="how many?", previous_response_id=second.id, **common)
    assert third.output_text == "Two files."

    records = gateway.records(session.key)
    assert len(records) == 3
    sent = records[2].upstream_request["messages"]
    assert sent[0] == {"role": "system", "content": "You are Codex."}
    assert sent[1] == {"role": "user", "content": "list files"}
    assert sent[2]["reasoning"] == "run ls"
    assert sent[2]["tool_calls"][0]["id"] == call.call_id
    assert sent[3] == {"role": "tool", "tool_call_id": call.call_id, "content": "a.txt"}
    assert sent[4] == {"role": "assistant", "content": "Done: a.txt"}
    assert sent[5] == {"role": "user", "content": "how many?"}
    assert "feature previous_response_id: honoured" in records[1].notes
    # What the engine saw: the whole first turn before the new input.
    prompts = [tokenizer.decode(engine_tokens(reply)[0]) for reply in gateway.engine_log]
    assert "list files" in prompts[1] and "a.txt" in prompts[1]
    assert "Done: a.txt" in prompts[2] and prompts[2].index("list files") < prompts[2].index("how")
    if gateway.render_mode == "gateway":
        for before, after in itertools.pairwise(records):
            assert "prompt_extends_sampled_turn" in after.flags
            whole = before.prompt_ids + before.sampled_ids
            assert after.prompt_ids[: len(whole)] == whole
        for record, reply in zip(records, gateway.engine_log, strict=True):
            assert (record.prompt_ids, record.sampled_ids, record.logprobs) == engine_tokens(reply)
    trajectory = create_builder("prefix_merging").build(records)
    meta = trajectory.metadata
    assert meta["context_exact_calls"] == meta["merged_calls"]
    if gateway.render_mode == "gateway":
        assert meta["num_traces"] == 1 and meta["merged_calls"] == 2, meta


@pytest.mark.conformance(feature="retrieve", api=API, status="supported")
@pytest.mark.parametrize("stream", [False, True])
def test_retrieve_returns_what_create_returned(live_gateway, stream):
    session, client = client_for(live_gateway)
    live_gateway.script(ScriptedReply(content="Hello there.", reasoning="greet"))
    created = create(client, stream, model="gpt-5", input="hi", instructions="Be kind.")
    assert created.store is True
    fetched = client.responses.retrieve(created.id)
    assert fetched.model_dump() == created.model_dump()
    direct = openai.OpenAI(
        base_url=live_gateway.base_url + "/v1", api_key=session.key, max_retries=0
    )
    assert direct.responses.retrieve(created.id).model_dump() == created.model_dump()


@pytest.mark.conformance(feature="delete_response", api=API, status="supported")
def test_delete_forgets_a_stored_response(live_gateway):
    _, client = client_for(live_gateway)
    live_gateway.script(ScriptedReply(content="ok"))
    created = client.responses.create(model="gpt-5", input="hi")
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)


@pytest.mark.conformance(feature="store_false", api=API, status="supported")
def test_store_false_is_neither_retrievable_nor_continuable(live_gateway):
    _, client = client_for(live_gateway)
    live_gateway.script(ScriptedReply(content="ok"))
    created = client.responses.create(model="gpt-5", input="hi", store=False)
    assert created.store is False
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.BadRequestError, match=f"Previous response with id '{created.id}'"):
        client.responses.create(model="gpt-5", input="more", previous_response_id=created.id)
    assert len(live_gateway.engine_log) == 1


@pytest.mark.conformance(feature="previous_response_id_unknown", api=API, status="refused")
def test_unknown_and_foreign_ids_are_not_found(live_gateway):
    _, owner = client_for(live_gateway)
    _, other = client_for(live_gateway)
    live_gateway.script(ScriptedReply(content="mine"))
    created = owner.responses.create(model="gpt-5", input="hi")
    for reply_id in (created.id, "resp_made_up"):
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(reply_id)
        with pytest.raises(openai.BadRequestError) as refused:
            other.responses.create(model="gpt-5", input="more", previous_response_id=reply_id)
        assert refused.value.body["message"] == f"Previous response with id '{reply_id}' not found."
    assert len(live_gateway.engine_log) == 1


@pytest.mark.conformance(feature="conversation", api=API, status="refused")
@pytest.mark.parametrize("conversation", ["conv_123", {"id": "conv_123"}])
def test_conversation_is_refused_by_name(live_gateway, conversation):
    _, client = client_for(live_gateway)
    with pytest.raises(openai.BadRequestError, match="conversation is not supported"):
        client.responses.create(model="gpt-5", input="hi", conversation=conversation)
    assert live_gateway.engine_log == []


def test_input_tokens_count_the_continued_context(live_gateway):
    _, client = client_for(live_gateway)
    live_gateway.script(ScriptedReply(content="A long answer " * 20))
    created = client.responses.create(model="gpt-5", input="hi")
    alone = client.responses.input_tokens.count(model="gpt-5", input="more")
    continued = client.responses.input_tokens.count(
        model="gpt-5", input="more", previous_response_id=created.id
    )
    assert continued.input_tokens > alone.input_tokens + 20
    assert json.loads(json.dumps(continued.model_dump()))["object"] == "response.input_tokens"
