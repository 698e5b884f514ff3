"""Bad input of every kind gets a clear error in the caller's provider shape; serving goes on."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from polar.capture.store import CaptureStore
from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine, ScriptedReply
from polar.engines.vllm import VLLMEngine
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.services import app_services

pytestmark = pytest.mark.slow

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "m", "input": "hi"}
GOOGLE = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}

# (path, valid body, how to read the error message from the provider's error body, expected type)
SHAPES = {
    "openai_chat": ("/v1/chat/completions", CHAT, lambda b: b["error"]["message"]),
    "openai_responses": ("/v1/responses", RESPONSES, lambda b: b["error"]["message"]),
    "anthropic": ("/v1/messages", ANTHROPIC, lambda b: b["error"]["message"]),
    "google": ("/v1beta/models/m:generateContent", GOOGLE, lambda b: b["error"]["message"]),
}


def _shape_ok(provider: str, body: dict, status: int) -> None:
    if provider == "anthropic":
        assert body["type"] == "error" and isinstance(body["error"]["type"], str)
    elif provider == "google":
        assert body["error"]["code"] == status and isinstance(body["error"]["status"], str)
    else:
        assert isinstance(body["error"]["type"], str)


@pytest.fixture
def gateway(tmp_path, tokenizer):
    def build(engine=None, **config):
        cfg = GatewayConfig(capture_db=tmp_path / "c.db", **config)
        engine = engine or ScriptedEngine(ScriptedBackend(Script(), tokenizer=tokenizer))
        store = CaptureStore(cfg.capture_db)
        app = create_app(cfg, engine=engine, store=store)
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://gw",
            # the admin token (made in tmp_path); the model API reads other headers for its key
            headers={"x-polar-admin-token": app_services(app).admin_token or ""},
        )
        return app, client, engine, store

    return build


async def _session(client: httpx.AsyncClient) -> str:
    reply = await client.post("/polar/sessions", json={})
    return reply.json()["session_id"]


@pytest.mark.parametrize("provider", SHAPES)
async def test_malformed_and_wrong_types_are_400s_and_serving_continues(gateway, provider):
    _, client, *_ = gateway()
    key = await _session(client)
    path, valid, message = SHAPES[provider]
    url = f"/s/{key}{path}"
    cases = [
        b"{not json",
        b"",
        b"[1, 2, 3]",
        b'"just a string"',
        {**valid, "messages": "nope"}
        if "messages" in valid
        else {**valid, "contents": 5}
        if "contents" in valid
        else {**valid, "input": 5},
        {**valid, "temperature": "hot"}
        if provider != "google"
        else {**valid, "generationConfig": {"temperature": "hot"}},
    ]
    for case in cases:
        kwargs = {"content": case} if isinstance(case, bytes) else {"json": case}
        reply = await client.post(url, **kwargs)
        assert reply.status_code == 400, (case, reply.text)
        body = reply.json()
        _shape_ok(provider, body, 400)
        assert message(body)
    assert (await client.post(url, json=valid)).status_code == 200


@pytest.mark.parametrize("provider", SHAPES)
async def test_missing_and_unknown_sessions_are_401_in_provider_shape(gateway, provider):
    _, client, *_ = gateway()
    path, valid, message = SHAPES[provider]
    for url, headers in [
        (path, {}),
        (f"/s/unknown{path}", {}),
        (path, {"authorization": "Bearer nope", "x-api-key": "nope"}),
    ]:
        reply = await client.post(url, json=valid, headers=headers)
        assert reply.status_code == 401
        _shape_ok(provider, reply.json(), 401)
        assert "session" in message(reply.json())


async def test_auto_registration_accepts_new_keys(gateway):
    _, client, _, store = gateway(auto_register=True)
    reply = await client.post(
        "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer fresh-key"}
    )
    assert reply.status_code == 200
    assert len(store.records("fresh-key")) == 1


async def test_unknown_path_is_404(gateway):
    _, client, *_ = gateway()
    key = await _session(client)
    for method, url in [
        ("POST", f"/s/{key}/v1/embeddings"),
        ("GET", f"/s/{key}/v1/chat/completions"),
        ("POST", "/nothing/here"),
    ]:
        reply = await client.request(method, url, json=CHAT)
        assert reply.status_code == 404
        assert reply.json()["error"]["message"]


@pytest.mark.parametrize("provider", SHAPES)
async def test_oversized_body_is_413(gateway, provider):
    _, client, *_ = gateway(max_body_bytes=4096)
    key = await _session(client)
    path, valid, _ = SHAPES[provider]
    big = dict(valid) | {"padding": "x" * 10_000}
    reply = await client.post(f"/s/{key}{path}", json=big)
    assert reply.status_code == 413
    _shape_ok(provider, reply.json(), 413)
    assert (await client.post(f"/s/{key}{path}", json=valid)).status_code == 200


@pytest.mark.parametrize("provider", SHAPES)
async def test_engine_refusing_is_a_provider_error_and_nothing_is_recorded(gateway, provider):
    _, client, engine, store = gateway()
    key = await _session(client)
    path, valid, message = SHAPES[provider]
    engine.backend.script.push(
        ScriptedReply(error_status=400, error_message="prompt too long for context")
    )
    reply = await client.post(f"/s/{key}{path}", json=valid)
    assert reply.status_code == 400
    assert "prompt too long for context" in message(reply.json())
    engine.backend.script.push(ScriptedReply(error_status=503, error_message="busy"))
    reply = await client.post(f"/s/{key}{path}", json=valid)
    assert reply.status_code == 503
    _shape_ok(provider, reply.json(), 503)
    assert store.records(key) == []
    assert (await client.post(f"/s/{key}{path}", json=valid)).status_code == 200
    assert len(store.records(key)) == 1


async def test_engine_unreachable_is_503_and_timeout_is_504(gateway, tokenizer):
    unreachable = VLLMEngine("http://127.0.0.1:9", timeout_s=2)
    _, client, *_ = gateway(engine=unreachable)
    key = await _session(client)
    reply = await client.post(f"/s/{key}/v1/messages", json=ANTHROPIC)
    assert reply.status_code == 503
    assert reply.json()["error"]["type"] == "overloaded_error"
    assert "unreachable" in reply.json()["error"]["message"]

    slow = ScriptedEngine(
        ScriptedBackend(Script([ScriptedReply(delay_s=1.0)]), tokenizer=tokenizer), timeout_s=0.2
    )
    _, client, *_ = gateway(engine=slow)
    key = await _session(client)
    reply = await client.post(f"/s/{key}/v1/chat/completions", json=CHAT)
    assert reply.status_code == 504
    assert "timed out" in reply.json()["error"]["message"]


async def test_streaming_request_errors_keep_the_provider_shape(gateway):
    _, client, engine, _ = gateway()
    key = await _session(client)
    # Before the stream opens (a body the adapter refuses) the answer is a plain HTTP error ...
    bad_body = ANTHROPIC | {"stream": True, "messages": "hi"}
    reply = await client.post(f"/s/{key}/v1/messages", json=bad_body)
    assert reply.status_code == 400
    assert reply.json()["type"] == "error"
    # ... as is an engine refusal within the headers' grace (0.5 s) ...
    engine.backend.script.push(ScriptedReply(error_status=400, error_message="bad"))
    reply = await client.post(f"/s/{key}/v1/messages", json=ANTHROPIC | {"stream": True})
    assert reply.status_code == 400 and reply.json()["error"]["message"].endswith("bad")
    # ... after it opened (the engine fails later), the provider's in-stream error event.
    engine.backend.script.push(ScriptedReply(error_status=400, error_message="bad", delay_s=0.7))
    reply = await client.post(f"/s/{key}/v1/messages", json=ANTHROPIC | {"stream": True})
    assert reply.status_code == 200
    event, data = reply.text.strip().split("\n\n")[-1].split("\n")
    assert event == "event: error"
    assert json.loads(data.removeprefix("data: "))["error"]["message"].endswith("bad")


async def test_admin_token_guards_admin_routes(gateway):
    _, client, *_ = gateway(admin_token="s3cret")
    anonymous = {"x-polar-admin-token": ""}
    assert (await client.post("/polar/sessions", json={}, headers=anonymous)).status_code == 401
    reply = await client.post("/polar/sessions", json={}, headers={"x-polar-admin-token": "s3cret"})
    assert reply.status_code == 201
    key = reply.json()["session_id"]
    # The session key works for model calls but not for admin routes.
    assert (
        await client.get(
            f"/polar/sessions/{key}/records",
            headers={"authorization": f"Bearer {key}", **anonymous},
        )
    ).status_code == 401
    assert (await client.post(f"/s/{key}/v1/chat/completions", json=CHAT)).status_code == 200


async def test_pause_holds_new_calls_until_resume(gateway):
    _, client, *_ = gateway()
    key = await _session(client)
    assert (await client.post("/polar/pause", json={"timeout_s": 5})).json()["drained"] is True
    call = asyncio.create_task(client.post(f"/s/{key}/v1/chat/completions", json=CHAT))
    await asyncio.sleep(0.3)
    assert not call.done()
    await client.post("/polar/resume")
    assert (await call).status_code == 200


async def test_side_calls_are_tagged_by_the_sessions_harness(gateway):
    _, client, _, store = gateway()
    reply = await client.post("/polar/sessions", json={"metadata": {"harness": "opencode"}})
    key = reply.json()["session_id"]
    title_call = {
        "model": "m",
        "messages": [
            {
                "role": "system",
                "content": "You are a title generator. You output ONLY a thread title.",
            },
            {"role": "user", "content": "fix the bug"},
        ],
    }
    assert (await client.post(f"/s/{key}/v1/chat/completions", json=title_call)).status_code == 200
    assert (await client.post(f"/s/{key}/v1/chat/completions", json=CHAT)).status_code == 200
    first, second = store.records(key)
    assert first.tags and first.tags[0].startswith("side_call:")
    assert second.tags == []


def test_a_caller_hanging_up_cancels_its_engine_call(live_gateway):
    """A harness that gives up on a call (its own timeout) must not keep the engine busy: the
    engine call is cancelled, nothing is recorded for it, and the gateway serves on."""
    session = live_gateway.new_session()
    url = session.base_urls["openai"] + "/chat/completions"
    live_gateway.script(ScriptedReply(content="too late", delay_s=1.5))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, json=CHAT, timeout=httpx.Timeout(5.0, read=0.3))
    time.sleep(2.5)  # past the reply's delay: a call still running would have finished
    assert live_gateway.engine_log == []
    assert live_gateway.records(session.key) == []
    live_gateway.script(ScriptedReply(content="on time"))
    reply = httpx.post(url, json=CHAT, timeout=10.0)
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"]["content"] == "on time"
    assert len(live_gateway.records(session.key)) == 1
