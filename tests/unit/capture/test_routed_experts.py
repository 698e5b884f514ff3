"""MoE routing replay: vLLM 0.32's per-choice ``routed_experts`` captured, stored and merged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from polar.capture import routed_experts
from polar.capture.records import CaptureRecord
from polar.capture.store import CaptureStore
from polar.engines.scripted import Script, ScriptedBackend, create_scripted_app
from polar.engines.vllm import VLLMEngine
from polar.errors import MalformedEngineReply
from polar.providers.types import NormalizedRequest, SamplingParams
from polar.trajectory.exporters.slime import SlimeExporter
from polar.trajectory.exporters.verl import VerlExporter
from polar.trajectory.per_request import PerRequestBuilder
from polar.trajectory.prefix_merging import PrefixMergingBuilder

LAYERS, TOP_K = 3, 2


def _routing(n: int, seed: int = 0) -> np.ndarray:
    """What vLLM's server sends: int32 expert ids, (positions, layers, top_k)."""
    return np.random.default_rng(seed).integers(0, 64, (n, LAYERS, TOP_K), dtype=np.int32)


class MoEReplies(httpx.AsyncBaseTransport):
    """The scripted engine, each reply given ``routed_experts`` as vLLM 0.32 adds them."""

    def __init__(self, tokenizer: Any, *, off_by: int = 0) -> None:
        self.inner = httpx.ASGITransport(
            app=create_scripted_app(ScriptedBackend(Script(), tokenizer=tokenizer))
        )
        self.off_by = off_by
        self.sent: list[np.ndarray] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        await response.aread()
        body = json.loads(response.content)
        if request.url.path.endswith("completions"):
            choice = body["choices"][0]
            prompt = choice.get("prompt_token_ids") or body.get("prompt_token_ids")
            array = _routing(len(prompt) + len(choice["token_ids"]) - 1 + self.off_by)
            self.sent.append(array)
            choice["routed_experts"] = routed_experts.encode(array)
        return httpx.Response(response.status_code, json=body)


def _request() -> NormalizedRequest:
    return NormalizedRequest(
        provider="openai_chat",
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "hi"}],
        params=SamplingParams(max_tokens=8),
    )


async def test_chat_and_token_prompts_capture_vllm_routed_experts_exactly(tokenizer: Any) -> None:
    transport = MoEReplies(tokenizer)
    engine = VLLMEngine("http://engine", transport=transport)
    result = await engine.complete(_request())
    sampled = await engine.complete_tokens(result.tokens.prompt_ids, _request())
    await engine.aclose()
    for text, sent in zip(
        [result.tokens.routed_experts, sampled.routed_experts], transport.sent, strict=True
    ):
        assert text is not None
        got = routed_experts.decode(text)
        assert got.dtype == np.uint8  # 64 experts: one byte per layer and choice
        assert np.array_equal(got, sent)


async def test_routing_that_does_not_cover_the_tokens_is_flagged_not_kept(tokenizer: Any) -> None:
    engine = VLLMEngine("http://engine", transport=MoEReplies(tokenizer, off_by=1))
    result = await engine.complete(_request())
    await engine.aclose()
    assert result.tokens.routed_experts is None
    assert routed_experts.FLAG_ROUTED_EXPERTS_MISALIGNED in result.tokens.flags


def test_malformed_routing_is_the_engines_fault() -> None:
    with pytest.raises(MalformedEngineReply):
        routed_experts.decode("not base64!")
    flat = routed_experts.encode(np.zeros((4, 2, 2), dtype=np.int32))
    assert routed_experts.decode(flat).shape == (4, 2, 2)
    with pytest.raises(MalformedEngineReply, match="positions, layers, top_k"):
        routed_experts.decode(routed_experts.encode(np.zeros((4, 2), dtype=np.int32)))


async def test_the_store_keeps_routing_beside_the_tokens(tmp_path: Path) -> None:
    array = _routing(5 + 3 - 1)
    record = CaptureRecord(
        completion_id="chatcmpl-1",
        session_id="s",
        provider="openai_chat",
        model="m",
        engine="vllm",
        started_at=0.0,
        finished_at=1.0,
        upstream_request={},
        response={"role": "assistant", "content": "x"},
        prompt_ids=[1, 2, 3, 4, 5],
        sampled_ids=[6, 7, 8],
        logprobs=[-0.1, -0.2, -0.3],
        finish_reason="stop",
        routed_experts=routed_experts.encode(array),
    )
    store = CaptureStore(tmp_path / "c.db")
    try:
        await store.append(record)
        (back,) = store.records("s")
    finally:
        store.close()
    assert back.routed_experts is not None
    assert np.array_equal(routed_experts.decode(back.routed_experts), array)


def test_a_merged_chain_takes_each_position_from_the_call_that_first_forwarded_it() -> None:
    # call 1: prompt 4 + sampled 3 -> covers 6 positions; call 2: prompt 9 + sampled 2 -> 10.
    first, second = _routing(6, seed=1), _routing(10, seed=2)
    merged = routed_experts.merge(
        [(routed_experts.encode(first), 7), (routed_experts.encode(second), 11)], length=11
    )
    assert merged is not None and merged.shape == (10, LAYERS, TOP_K)
    assert np.array_equal(merged[:6], first)  # call 1's sampled tokens as routed when sampled
    assert np.array_equal(merged[6:], second[6:])  # the rest from call 2's prefill and decode
    assert routed_experts.merge([(None, 7), (routed_experts.encode(second), 11)], 11) is None


def _call(n: int, prompt: list[int], sampled: list[int], routing: np.ndarray) -> CaptureRecord:
    return CaptureRecord(
        completion_id=f"chatcmpl-{n}",
        session_id="s",
        seq=n,
        provider="openai_chat",
        model="m",
        engine="vllm",
        started_at=float(n),
        finished_at=float(n) + 0.5,
        upstream_request={"messages": []},
        response={"role": "assistant", "content": "x"},
        prompt_ids=prompt,
        sampled_ids=sampled,
        logprobs=[-0.5] * len(sampled),
        finish_reason="stop",
        routed_experts=routed_experts.encode(routing),
    )


def test_routing_reaches_the_slime_and_verl_rows_aligned_with_the_sampled_tokens() -> None:
    # The design's worked example (end-of-turn 99), each call with its own routing.
    first = _call(1, [1, 2, 3], [10, 11, 99], _routing(3 + 3 - 1, seed=1))
    second = _call(2, [1, 2, 3, 10, 11, 99, 50, 51], [20, 21, 99], _routing(8 + 3 - 1, seed=2))
    trajectory = PrefixMergingBuilder({"eot_token_id": 99}).build([first, second])
    (trace,) = trajectory.traces
    assert trace.loss_mask == [1, 1, 1, 0, 0, 1, 1, 1]  # 50, 51 interstitial: not sampled
    row = SlimeExporter().row(trace, {"session_id": "s"})
    routing = np.asarray(row["rollout_routed_experts"])
    assert routing.shape == (len(row["tokens"]) - 1, LAYERS, TOP_K)
    # Position p routes token p; call 1's sampled tokens keep the routing they were sampled
    # with, the rest (its last token, the interstitial, call 2's) comes from call 2.
    assert np.array_equal(routing[:5], routed_experts.decode(first.routed_experts or ""))
    assert np.array_equal(routing[5:], routed_experts.decode(second.routed_experts or "")[5:])
    assert np.array_equal(VerlExporter().row(trace, {})["routed_experts"], routing)
    per_request = PerRequestBuilder().build([first, second])
    for trace, call in zip(per_request.traces, [first, second], strict=True):
        row = SlimeExporter().row(trace, {})
        assert np.array_equal(
            row["rollout_routed_experts"], routed_experts.decode(call.routed_experts or "")
        )


def test_a_trace_without_routing_on_every_call_carries_none() -> None:
    first = _call(1, [1, 2, 3], [10, 11, 99], _routing(5))
    second = _call(2, [1, 2, 3, 10, 11, 99, 50], [20, 99], _routing(8)).model_copy(
        update={"routed_experts": None}
    )
    (trace,) = PrefixMergingBuilder({"eot_token_id": 99}).build([first, second]).traces
    assert "routed_experts" not in trace.metadata
    assert SlimeExporter().row(trace, {})["rollout_routed_experts"] is None
    assert VerlExporter().row(trace, {})["routed_experts"] is None
