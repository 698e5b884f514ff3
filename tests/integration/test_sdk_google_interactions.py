"""google-genai's own Interactions client against the live gateway and the scripted engine: a
multi-turn tool session continued by previous_interaction_id (whole and streamed, in both render
modes) captured exactly; stored interactions fetched, deleted and scoped per session; reasoning,
images, stream liveness and in-stream errors, each the API's own way."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from google import genai
from google.genai import types
from google.genai._interactions_errors import (
    AuthenticationError,
    BadRequestError,
    NotFoundError,
)

from polar.engines.scripted import ScriptedReply
from polar.engines.scripted import logged_tokens as engine_tokens
from polar.gateway.services import app_services
from polar.trajectory.registry import create_builder

pytestmark = pytest.mark.slow

API = "google_interactions"
MODES = ("engine", "gateway")
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
}
SYSTEM = "You are terse."
REASONING = "The user wants a listing; ls does it."
IMAGE_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def client_for(gateway: Any) -> tuple[Any, genai.Client]:
    session = gateway.new_session()
    options = types.HttpOptions(
        base_url=session.base_urls["google"], retry_options=types.HttpRetryOptions(attempts=1)
    )
    return session, genai.Client(api_key=session.key, http_options=options)


@dataclass
class Turn:
    """What a client reads off one interaction, whole or streamed."""

    id: str
    status: str
    text: str = ""
    reasoning: str = ""
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    output_tokens: int = 0


def create(client: genai.Client, stream: bool, **kwargs: Any) -> Turn:
    if not stream:
        reply = client.interactions.create(**kwargs)
        steps = reply.steps or []
        return Turn(
            id=reply.id,
            status=reply.status,
            text="".join(c.text for s in steps if s.type == "model_output" for c in s.content),
            reasoning="".join(
                c.text for s in steps if s.type == "thought" for c in s.summary or []
            ),
            calls=[(s.id, s.name, s.arguments) for s in steps if s.type == "function_call"],
            output_tokens=reply.usage.total_output_tokens,
        )
    events = list(client.interactions.create(stream=True, **kwargs))
    assert events[0].event_type == "interaction.created"
    assert events[-1].event_type == "interaction.completed"
    done = events[-1].interaction
    turn = Turn(id=done.id, status=done.status, output_tokens=done.usage.total_output_tokens)
    arguments: dict[int, str] = {}
    for event in events:
        if event.event_type == "step.start" and event.step.type == "function_call":
            turn.calls.append((event.step.id, event.step.name, {}))
            arguments[len(turn.calls) - 1] = ""
        elif event.event_type == "step.delta":
            delta = event.delta
            if delta.type == "text":
                turn.text += delta.text
            elif delta.type == "thought_summary":
                turn.reasoning += delta.content.text
            elif delta.type == "arguments_delta":
                arguments[len(turn.calls) - 1] += delta.arguments
    turn.calls = [(i, n, orjson.loads(arguments[k])) for k, (i, n, _) in enumerate(turn.calls)]
    return turn


@pytest.mark.conformance(feature="previous_interaction_id", api=API, status="supported")
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_tool_session_continues_by_previous_interaction_id_exactly(
    noncanonical_gateway: Any, tokenizer: Any, stream: bool
) -> None:
    gateway = noncanonical_gateway
    gateway.reset()
    session, client = client_for(gateway)
    gateway.script(
        ScriptedReply(content="", reasoning="run ls", tool_calls=[("shell", {"command": "ls"})]),
        ScriptedReply(content="Done: a.txt"),
        ScriptedReply(content="Two files."),
    )
    common: dict[str, Any] = {"model": "gemini-3-flash-preview", "tools": [SHELL]}
    first = create(client, stream, input="list files", system_instruction=SYSTEM, **common)
    assert first.status == "requires_action" and first.reasoning == "run ls"
    ((call_id, name, arguments),) = first.calls
    assert (name, arguments) == ("shell", {"command": "ls"})
    result = {"type": "function_result", "call_id": call_id, "name": name, "result": "a.txt"}
    second = create(
        client,
        stream,
        input=[result],
        previous_interaction_id=first.id,
        system_instruction=SYSTEM,
        **common,
    )
    assert (second.status, second.text) == ("completed", "Done: a.txt")
    third = create(
        client,
        stream,
        input="how many?",
        previous_interaction_id=second.id,
        system_instruction=SYSTEM,
        **common,
    )
    assert third.text == "Two files."

    records = gateway.records(session.key)
    assert [r.provider for r in records] == [API] * 3
    sent = records[2].upstream_request["messages"]
    assert sent[0] == {"role": "system", "content": SYSTEM}
    assert sent[1] == {"role": "user", "content": "list files"}
    assert sent[2]["reasoning"] == "run ls"
    assert sent[2]["tool_calls"][0]["id"] == call_id
    assert sent[3] == {"role": "tool", "tool_call_id": call_id, "content": "a.txt"}
    assert sent[4] == {"role": "assistant", "content": "Done: a.txt"}
    assert sent[5] == {"role": "user", "content": "how many?"}
    assert len(sent) == 6  # the earlier system_instruction is not repeated
    assert "feature previous_interaction_id: honoured" in records[1].notes
    assert third.output_tokens == len(records[2].sampled_ids)
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
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_get_returns_the_whole_timeline_create_answered(live_gateway: Any, stream: bool) -> None:
    session, client = client_for(live_gateway)
    live_gateway.script(ScriptedReply(content="Hello there.", reasoning="greet"))
    created = create(client, stream, model="g", input="hi", system_instruction="Be kind.")
    fetched = client.interactions.get(created.id)
    assert fetched.id == created.id and fetched.status == "completed"
    assert [s.type for s in fetched.steps or []] == ["user_input", "thought", "model_output"]
    assert fetched.output_text == "Hello there." and fetched.system_instruction == "Be kind."
    assert fetched.usage.total_output_tokens == created.output_tokens
    direct = httpx.get(
        f"{live_gateway.base_url}/v1beta/interactions/{created.id}",
        headers={"x-goog-api-key": session.key},
    )
    assert direct.status_code == 200 and direct.json()["id"] == created.id


@pytest.mark.conformance(feature="delete_response", api=API, status="supported")
def test_delete_forgets_a_stored_interaction(live_gateway: Any) -> None:
    _, client = client_for(live_gateway)
    live_gateway.script(ScriptedReply(content="ok"))
    created = client.interactions.create(model="g", input="hi")
    client.interactions.delete(created.id)
    with pytest.raises(NotFoundError, match="not found"):
        client.interactions.get(created.id)
    with pytest.raises(NotFoundError):
        client.interactions.delete(created.id)


@pytest.mark.conformance(feature="store_false", api=API, status="supported")
def test_store_false_is_neither_retrievable_nor_continuable(live_gateway: Any) -> None:
    _, client = client_for(live_gateway)
    live_gateway.script(ScriptedReply(content="ok"))
    created = client.interactions.create(model="g", input="hi", store=False)
    with pytest.raises(NotFoundError, match="not found"):
        client.interactions.get(created.id)
    with pytest.raises(BadRequestError, match=f"Previous interaction with id '{created.id}'"):
        client.interactions.create(model="g", input="more", previous_interaction_id=created.id)
    assert len(live_gateway.engine_log) == 1


@pytest.mark.conformance(feature="previous_interaction_id_unknown", api=API, status="refused")
def test_unknown_and_foreign_ids_are_not_found(live_gateway: Any) -> None:
    _, owner = client_for(live_gateway)
    _, other = client_for(live_gateway)
    live_gateway.script(ScriptedReply(content="mine"))
    created = owner.interactions.create(model="g", input="hi")
    for reply_id in (created.id, "v1_made_up"):
        with pytest.raises(NotFoundError):
            other.interactions.get(reply_id)
        with pytest.raises(BadRequestError) as refused:
            other.interactions.create(model="g", input="more", previous_interaction_id=reply_id)
        assert f"Previous interaction with id '{reply_id}' not found." in str(refused.value)
    assert len(live_gateway.engine_log) == 1


def test_an_unknown_key_is_the_apis_authentication_error(live_gateway: Any) -> None:
    client = genai.Client(
        api_key="not-a-session",
        http_options=types.HttpOptions(
            base_url=live_gateway.base_url, retry_options=types.HttpRetryOptions(attempts=1)
        ),
    )
    with pytest.raises(AuthenticationError) as refused:
        client.interactions.create(model="g", input="hi")
    assert refused.value.status_code == 401


@pytest.fixture
def gateway(noncanonical_gateway: Any) -> Iterator[Any]:
    noncanonical_gateway.reset()
    yield noncanonical_gateway
    noncanonical_gateway.engine.backend.multimodal = False
    noncanonical_gateway.reset()


def in_both_modes(feature: str, statuses: tuple[str, str]) -> pytest.MarkDecorator:
    """Parametrize over the render mode; each mode is a conformance cell of its own."""
    params = [
        pytest.param(
            mode,
            marks=pytest.mark.conformance(
                feature=f"{feature} ({mode} rendering)", api=API, status=statuses[i]
            ),
            id=mode,
        )
        for i, mode in enumerate(MODES)
    ]
    return pytest.mark.parametrize("noncanonical_gateway", params, indirect=True)


@in_both_modes("reasoning", ("supported", "supported"))
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_reasoning_comes_back_as_a_thought_step(gateway: Any, stream: bool) -> None:
    session, client = client_for(gateway)
    gateway.script(ScriptedReply(content="Two files.", reasoning=REASONING))
    turn = create(client, stream, model="g", input="Files?")
    assert (turn.reasoning, turn.text) == (REASONING, "Two files.")
    [record] = gateway.records(session.key)
    assert record.response["reasoning"] == REASONING
    assert record.response["content"] == "Two files."  # not left in the answer


@in_both_modes("images", ("supported", "refused"))
def test_images_reach_a_multimodal_engine_or_are_refused_by_name(gateway: Any) -> None:
    _, client = client_for(gateway)
    image = {"type": "image", "data": IMAGE_PNG, "mime_type": "image/png"}
    content = [image, {"type": "text", "text": "What is this?"}]
    gateway.script(ScriptedReply(content="A cat."), ScriptedReply(content="A cat."))
    with pytest.raises(BadRequestError) as refused:
        client.interactions.create(model="g", input=content)
    if gateway.render_mode == "gateway":
        assert "images are not supported under gateway rendering" in str(refused.value)
        assert gateway.engine.backend.requests == []  # refused before the engine
        return
    assert "is not a multimodal model" in str(refused.value)  # the text-only engine's 400
    gateway.engine.backend.multimodal = True
    client.interactions.create(model="g", input=content)
    parts = gateway.engine.backend.requests[-1]["messages"][-1]["content"]
    assert {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{IMAGE_PNG}"},
    } in parts


@pytest.fixture
def slow_streams(live_gateway: Any) -> Iterator[Any]:
    config = app_services(live_gateway.app).config
    before = config.stream_keepalive_s, config.stream_status_grace_s
    config.stream_keepalive_s, config.stream_status_grace_s = 0.1, 0.2
    yield live_gateway
    config.stream_keepalive_s, config.stream_status_grace_s = before


@pytest.mark.conformance(feature="stream_liveness", api=API, status="supported")
def test_headers_and_keepalives_before_the_engine_finishes(slow_streams: Any) -> None:
    gateway = slow_streams
    session = gateway.new_session()
    gateway.script(ScriptedReply(content="Slow answer.", delay_s=2.0))
    url = session.base_urls["google"] + "/v1/interactions"
    body = {"model": "g", "input": "hi", "stream": True}
    keep_alive = b": keep-alive\n\n"
    sent = time.monotonic()
    with httpx.stream("POST", url, json=body, timeout=30) as reply:
        first_byte = time.monotonic() - sent
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        keep_alives, records_at_content, rest = 0, None, b""
        for chunk in reply.iter_raw():
            if records_at_content is None and chunk == keep_alive * (len(chunk) // len(keep_alive)):
                keep_alives += len(chunk) // len(keep_alive)
                continue
            if records_at_content is None:
                records_at_content = len(gateway.records(session.key))
            rest += chunk
    assert first_byte < 1.0  # the engine takes 2 s
    assert keep_alives >= 3
    assert records_at_content == 1  # the capture is durable before any content is sent
    assert b'"text":"Slow answer."' in rest
    _, client = client_for(gateway)
    gateway.script(ScriptedReply(content="Two files.", delay_s=0.5))
    assert create(client, True, model="g", input="hi").text == "Two files."  # SDK skips them


@pytest.mark.conformance(feature="stream_error", api=API, status="supported")
def test_an_engine_failure_after_the_headers_is_the_apis_error_event(slow_streams: Any) -> None:
    gateway = slow_streams
    session, client = client_for(gateway)
    gateway.script(ScriptedReply(error_status=500, error_message="engine fell over", delay_s=0.3))
    events = list(client.interactions.create(model="g", input="hi", stream=True))
    assert [e.event_type for e in events] == ["error"]
    assert events[0].error.code == "api_error"
    assert "engine fell over" in events[0].error.message
    assert gateway.records(session.key) == []
