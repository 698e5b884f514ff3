"""The gateway in front of the embedded engine (tiny model): captures are the engine's tokens."""

from __future__ import annotations

import httpx
import pytest

from polar.engines.registry import EngineConfig, create_engine
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig, SamplingPolicy
from polar.gateway.services import app_services

from .engine_replies import gap_flags

pytestmark = pytest.mark.slow


async def test_embedded_engine_through_gateway_is_token_faithful(tmp_path):
    engine = create_engine(EngineConfig(kind="embedded", options={"model": "tiny"}))
    config = GatewayConfig(
        capture_db=tmp_path / "c.db",
        sampling=SamplingPolicy(temperature=1.0, seed=7, max_tokens=12),
        auth=False,  # loopback experiments' opt-out: this test is about tokens of another kind
    )
    app = create_app(config, engine=engine)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gw"
    ) as client:
        key = (await client.post("/polar/sessions", json={})).json()["session_id"]
        body = {
            "model": "anything",
            "max_tokens": 12,
            "messages": [{"role": "user", "content": "Say hi"}],
        }
        reply = await client.post(f"/s/{key}/v1/messages", json=body)
        assert reply.status_code == 200, reply.text
    [record] = app_services(app).store.records(key)
    assert record.engine == "embedded"
    assert gap_flags(record.flags) == []
    assert record.policy_version == engine.core.policy_version
    tok = engine.core.tokenizer
    expected = tok.apply_chat_template(
        [{"role": "user", "content": "Say hi"}], add_generation_prompt=True, tokenize=True
    )
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert record.prompt_ids == list(expected)
    assert 0 < len(record.sampled_ids) <= 12
    assert record.logprobs is not None and len(record.logprobs) == len(record.sampled_ids)
    assert reply.json()["usage"]["output_tokens"] == len(record.sampled_ids)
    await engine.aclose()
