"""The gateway's /metrics against a live gateway on loopback: what a run of calls did (answered,
streamed, failed plainly or in-stream, abandoned, refused) is what the counters say, parsed
with prometheus-client's own parser; the tokens counted are the captured records' tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metrics_scrape import scrape, scrape_until, total, value
from polar.capture.store import CaptureStore
from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine, ScriptedReply
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.server import BackgroundServer
from polar.gateway.services import app_services

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


class Gateway:
    def __init__(self, server: BackgroundServer, app: Any, script: Script) -> None:
        self.url = server.url
        self.app = app
        self.script = script
        self.token = app_services(app).admin_token
        self.admin = {"authorization": f"Bearer {self.token}"}

    def session(self) -> str:
        reply = httpx.post(f"{self.url}/polar/sessions", json={}, headers=self.admin)
        reply.raise_for_status()
        return str(reply.json()["api_key"])

    @property
    def store(self) -> CaptureStore:
        return app_services(self.app).store


@pytest.fixture
def gateway(tmp_path: Path, tokenizer: Any) -> Iterator[Gateway]:
    script = Script()
    config = GatewayConfig(
        capture_db=tmp_path / "captures.db", served_model="SmolLM2-135M-Instruct"
    )
    engine = ScriptedEngine(ScriptedBackend(script, tokenizer=tokenizer))
    app = create_app(config, engine=engine, store=CaptureStore(config.capture_db))
    with BackgroundServer(app) as server:
        yield Gateway(server, app, script)


def test_the_counters_are_what_the_calls_did(gateway: Gateway) -> None:
    key = gateway.session()
    chat = f"{gateway.url}/s/{key}/v1/chat/completions"
    failing = ScriptedReply(error_status=500, error_message="engine fell over")
    gateway.script.push(
        ScriptedReply(content="one"),
        ScriptedReply(content="two"),
        ScriptedReply(content="three, streamed"),
        failing,
        # Past the stream's status grace (0.5 s): answered in-stream, after a 200.
        ScriptedReply(error_status=500, error_message="engine fell over", delay_s=0.7),
    )
    for _ in range(2):
        assert httpx.post(chat, json=CHAT, timeout=30).status_code == 200
    streamed = httpx.post(chat, json={**CHAT, "stream": True}, timeout=30)
    assert streamed.status_code == 200 and "three, streamed" in streamed.text
    assert httpx.post(chat, json=CHAT, timeout=30).status_code == 502
    in_stream = httpx.post(chat, json={**CHAT, "stream": True}, timeout=30)
    assert in_stream.status_code == 200 and "engine fell over" in in_stream.text
    messages = f"{gateway.url}/s/{key}/v1/messages"
    reply = httpx.post(messages, json={**ANTHROPIC, "stream": True}, timeout=30)
    assert reply.status_code == 200 and "message_stop" in reply.text
    # Refused before any generation: an unknown key, a body that is not JSON.
    unknown = f"{gateway.url}/s/ps-unknown/v1/chat/completions"
    assert httpx.post(unknown, json=CHAT, timeout=30).status_code == 401
    assert httpx.post(chat, content=b"{not json", timeout=30).status_code == 400

    m = scrape(gateway.url, gateway.token)
    calls = "polar_gateway_calls_total"
    assert value(m, calls, provider="openai_chat", stream="false", outcome="ok") == 2
    assert value(m, calls, provider="openai_chat", stream="true", outcome="ok") == 1
    assert value(m, calls, provider="openai_chat", stream="false", outcome="error") == 1
    assert value(m, calls, provider="openai_chat", stream="true", outcome="error") == 1
    assert value(m, calls, provider="anthropic", stream="true", outcome="ok") == 1
    assert total(m, calls) == 6
    duration = "polar_gateway_call_duration_seconds_count"
    assert value(m, duration, provider="openai_chat", stream="false") == 3
    assert value(m, duration, provider="openai_chat", stream="true") == 2
    assert value(m, duration, provider="anthropic", stream="true") == 1
    # Every error answered, plain or in-stream, by its kind.
    errors = "polar_gateway_errors_total"
    assert value(m, errors, provider="openai_chat", kind="engine_error") == 2
    assert value(m, errors, provider="openai_chat", kind="authentication") == 1
    assert value(m, errors, provider="openai_chat", kind="invalid_request") == 1
    assert total(m, errors) == 4
    # Six engine calls (two failed), four captured.
    assert value(m, "polar_gateway_engine_duration_seconds_count") == 6
    assert value(m, "polar_gateway_capture_commit_duration_seconds_count") == 4
    records = gateway.store.records(key)
    assert len(records) == 4
    for provider in ("openai_chat", "anthropic"):
        mine = [r for r in records if r.provider == provider]
        prompt = sum(len(r.prompt_ids) for r in mine)
        sampled = sum(len(r.sampled_ids) for r in mine)
        assert prompt > 0 and sampled > 0
        assert value(m, "polar_gateway_prompt_tokens_total", provider=provider) == prompt
        assert value(m, "polar_gateway_sampled_tokens_total", provider=provider) == sampled
    assert value(m, "polar_gateway_sessions_open") == 1
    assert value(m, "polar_gateway_capture_queue_depth") == 0
    assert value(m, "polar_gateway_capture_fault") == 0
    assert total(m, "polar_gateway_node_sessions") == 0  # not a rollout node


def test_a_caller_that_hangs_up_is_counted_as_disconnected(gateway: Gateway) -> None:
    key = gateway.session()
    gateway.script.push(ScriptedReply(content="too late", delay_s=3.0))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gateway.url}/s/{key}/v1/chat/completions", json=CHAT, timeout=0.3)

    def counted(m: Any) -> bool:
        return bool(total(m, "polar_gateway_calls_total") == 1)

    m = scrape_until(gateway.url, gateway.token, counted)
    calls = "polar_gateway_calls_total"
    assert value(m, calls, provider="openai_chat", stream="false", outcome="disconnected") == 1
    errors = "polar_gateway_errors_total"
    assert value(m, errors, provider="openai_chat", kind="client_disconnected") == 1
    assert value(m, "polar_gateway_engine_duration_seconds_count") == 0  # cancelled: no sample
    assert gateway.store.records(key) == []


def test_metrics_need_the_admin_token(gateway: Gateway) -> None:
    key = gateway.session()
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Bearer {key}"}):
        assert httpx.get(f"{gateway.url}/metrics", headers=headers).status_code == 401
    assert httpx.get(f"{gateway.url}/metrics", headers=gateway.admin).status_code == 200
    # Read-only: no other method is served there (the model API's catch-all answers 404).
    assert httpx.post(f"{gateway.url}/metrics", headers=gateway.admin).status_code == 404
