"""The official google-genai SDK against the live gateway and scripted engine."""

from __future__ import annotations

import pytest
from google import genai
from google.genai import errors, types

from polar.engines.scripted import ScriptedReply
from polar.engines.scripted import logged_tokens as engine_tokens

pytestmark = pytest.mark.slow

SHELL = types.Tool(
    function_declarations=[
        types.FunctionDeclaration(
            name="shell",
            description="Run a command",
            parameters_json_schema={
                "type": "object",
                "properties": {"command": {"type": "string"}},
            },
        )
    ]
)


def _client(base_url: str, key: str) -> genai.Client:
    return genai.Client(api_key=key, http_options=types.HttpOptions(base_url=base_url))


def _assert_faithful(live_gateway, key):
    records = live_gateway.records(key)
    assert len(records) == len(live_gateway.engine_log) > 0
    for record, reply in zip(records, live_gateway.engine_log, strict=True):
        assert record.provider == "google"
        assert (record.prompt_ids, record.sampled_ids, record.logprobs) == engine_tokens(reply)
    return records


@pytest.mark.parametrize("stream", [False, True])
def test_function_calling_round_trip(live_gateway, stream):
    session = live_gateway.new_session()
    client = _client(session.base_urls["google"], session.key)
    live_gateway.script(
        ScriptedReply(
            content="Checking.", reasoning="list first", tool_calls=[("shell", {"command": "ls"})]
        ),
        ScriptedReply(content="Two files."),
    )
    config = types.GenerateContentConfig(tools=[SHELL], system_instruction="Be brief.")
    contents: list = [types.Content(role="user", parts=[types.Part(text="What files?")])]
    if stream:
        chunks = list(
            client.models.generate_content_stream(
                model="gemini-x", contents=contents, config=config
            )
        )
        parts = [p for c in chunks for p in c.candidates[0].content.parts]
        usage = chunks[-1].usage_metadata
    else:
        reply = client.models.generate_content(model="gemini-x", contents=contents, config=config)
        parts = reply.candidates[0].content.parts
        usage = reply.usage_metadata
    calls = [p.function_call for p in parts if p.function_call]
    assert [(c.name, c.args) for c in calls] == [("shell", {"command": "ls"})]
    assert usage.candidates_token_count == len(
        live_gateway.engine_log[0]["choices"][0]["token_ids"]
    )
    contents += [
        types.Content(role="model", parts=parts),
        types.Content(
            role="user",
            parts=[types.Part.from_function_response(name="shell", response={"output": "a b"})],
        ),
    ]
    second = client.models.generate_content(model="gemini-x", contents=contents, config=config)
    assert second.text == "Two files."
    records = _assert_faithful(live_gateway, session.key)
    history = records[1].upstream_request["messages"]
    assert history[0] == {"role": "system", "content": "Be brief."}
    assert history[2]["tool_calls"][0]["function"]["name"] == "shell"
    assert history[2].get("reasoning") == "list first"  # recovered from the thought signature
    assert (
        history[3]["role"] == "tool"
        and history[3]["tool_call_id"] == history[2]["tool_calls"][0]["id"]
    )


def test_unknown_key_raises_client_error(live_gateway):
    client = _client(live_gateway.base_url, "not-a-session")
    with pytest.raises(errors.ClientError) as info:
        client.models.generate_content(model="m", contents="hi")
    assert info.value.code == 401


@pytest.mark.conformance(feature="logprobs", api="google", status="supported")
@pytest.mark.parametrize("stream", [False, True])
def test_response_logprobs_are_the_captured_ones(noncanonical_gateway, stream):
    gateway = noncanonical_gateway
    gateway.reset()
    session = gateway.new_session()
    client = _client(session.base_urls["google"], session.key)
    gateway.script(ScriptedReply(content="Hello there."))
    config = types.GenerateContentConfig(response_logprobs=True)
    if stream:
        chunks = list(
            client.models.generate_content_stream(model="gemini-x", contents="Hi", config=config)
        )
        results = [c.candidates[0].logprobs_result for c in chunks if c.candidates]
        chosen = [x for r in results if r is not None for x in r.chosen_candidates or []]
    else:
        reply = client.models.generate_content(model="gemini-x", contents="Hi", config=config)
        chosen = reply.candidates[0].logprobs_result.chosen_candidates
        assert reply.candidates[0].avg_logprobs is not None
    (record,) = gateway.records(session.key)
    assert [c.log_probability for c in chosen] == record.logprobs
    assert "Hello" in "".join(c.token for c in chosen)
    assert "feature logprobs: honoured" in record.notes
    gateway.reset()


@pytest.mark.conformance(feature="top_logprobs", api="google", status="refused")
def test_top_candidate_logprobs_are_refused_by_name(live_gateway):
    session = live_gateway.new_session()
    client = _client(session.base_urls["google"], session.key)
    config = types.GenerateContentConfig(response_logprobs=True, logprobs=3)
    with pytest.raises(errors.ClientError, match="logprobs"):
        client.models.generate_content(model="gemini-x", contents="Hi", config=config)
    assert live_gateway.records(session.key) == []
