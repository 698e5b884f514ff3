"""What the gateway learns from a strict engine: its model name, its window, who renders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.capture.store import CaptureStore
from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine, ScriptedReply
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.services import app_services
from polar.rendering.model_files import SMOLLM2_MODEL_NAME, load_tokenizer

LONG = "word " * 400  # ~400 tokens


def gateway(tmp_path: Path, window: int, mode: str = "auto") -> tuple[Any, ScriptedBackend]:
    backend = ScriptedBackend(
        Script(default=ScriptedReply(content="ok")),
        tokenizer=load_tokenizer(),
        max_model_len=window,
    )
    config = GatewayConfig(capture_db=tmp_path / "c.db", auto_register=True, render={"mode": mode})
    app = create_app(config, engine=ScriptedEngine(backend), store=CaptureStore(config.capture_db))
    return app, backend


REQUESTS = {
    "openai_chat": (
        "/v1/chat/completions",
        {"model": "x", "messages": [{"role": "user", "content": LONG}]},
    ),
    "anthropic": (
        "/v1/messages",
        {"model": "x", "max_tokens": 64, "messages": [{"role": "user", "content": LONG}]},
    ),
    "google": (
        "/v1beta/models/x:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": LONG}]}]},
    ),
}


@pytest.mark.parametrize("mode", ["gateway", "engine"])
@pytest.mark.parametrize("provider", sorted(REQUESTS))
async def test_a_prompt_over_the_engines_window_gets_the_providers_context_error(
    tmp_path: Path, provider: str, mode: str
) -> None:
    app, backend = gateway(tmp_path, window=256, mode=mode)
    path, body = REQUESTS[provider]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
        reply = await c.post(
            path,
            json=body,
            headers={"authorization": "Bearer s1", "x-api-key": "s1", "x-goog-api-key": "s1"},
        )
    assert reply.status_code == 400, reply.text
    text = reply.text
    wording = {
        "openai_chat": "maximum context length is 256 tokens",
        "anthropic": "prompt is too long:",
        "google": "exceeds the maximum number of tokens allowed (256)",
    }[provider]
    assert wording in text
    if provider == "openai_chat":
        assert reply.json()["error"]["code"] == "context_length_exceeded"
    assert backend.log == []  # refused without a generation


async def test_the_served_name_and_window_come_from_the_engine(tmp_path: Path) -> None:
    app, _ = gateway(tmp_path, window=2048)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
        reply = await c.post(
            "/v1/chat/completions",
            json={
                "model": "claude-sonnet-9",
                "max_tokens": 100000,
                "messages": [{"role": "user", "content": "hi"}],
            },
            headers={"authorization": "Bearer s2"},
        )
        count = await c.post(
            "/v1/messages/count_tokens",
            json={"model": "claude-sonnet-9", "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-api-key": "s2"},
        )
    assert reply.status_code == 200, reply.text
    assert count.status_code == 200 and count.json()["input_tokens"] > 0
    records = app_services(app).store.records("s2")
    (rec,) = records
    assert rec.model == SMOLLM2_MODEL_NAME
    assert rec.sampling["max_tokens"] == 2048 - len(rec.prompt_ids)
    assert "max_tokens:100000->" + str(2048 - len(rec.prompt_ids)) in rec.flags


async def test_an_engine_that_does_not_serve_the_models_endpoint_fails_the_start_in_words(
    tmp_path: Path,
) -> None:
    from polar.engines.vllm import VLLMEngine
    from polar.errors import ConfigError
    from polar.gateway.engine_facts import discover

    engine = VLLMEngine("http://127.0.0.1:9/v1", timeout_s=2)
    with pytest.raises(ConfigError, match="ends in /v1"):
        await discover(GatewayConfig(capture_db=tmp_path / "c.db"), engine)
    await engine.aclose()


async def test_an_engine_without_tokenize_is_named_at_start_and_calls_still_work(
    tmp_path: Path,
) -> None:
    from polar.errors import EngineRejected
    from polar.gateway.engine_facts import discover

    class NoTokenize(ScriptedEngine):
        async def count_tokens(self, request: Any) -> int:
            raise EngineRejected("engine refused the request (HTTP 404): Not Found")

    backend = ScriptedBackend(
        Script(default=ScriptedReply(content="ok")), tokenizer=load_tokenizer()
    )
    config = GatewayConfig(capture_db=tmp_path / "c.db", render={"mode": "engine"})
    facts = await discover(config, NoTokenize(backend))
    assert facts.context_window is None
    assert any("/tokenize" in note for note in facts.notes)
    assert facts.served_model == SMOLLM2_MODEL_NAME


@pytest.mark.parametrize("mode", ["gateway", "engine"])
async def test_stop_sequences_reach_the_engine_and_come_back_named(
    tmp_path: Path, mode: str
) -> None:
    app, backend = gateway(tmp_path, window=4096, mode=mode)
    backend.script.push(ScriptedReply(content="Answer: 42\nObservation: more"))
    body = {
        "model": "x",
        "max_tokens": 64,
        "stop_sequences": ["Observation:"],
        "messages": [{"role": "user", "content": "Compute"}],
    }
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
        reply = await c.post("/v1/messages", json=body, headers={"x-api-key": "s3"})
    assert reply.status_code == 200, reply.text
    message = reply.json()
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "Observation:")
    assert message["content"][0]["text"].rstrip() == "Answer: 42"
