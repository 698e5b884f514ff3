"""A gateway in front of several engine replicas over real HTTP: session affinity, replica loss,
affinity after a gateway restart, and an external router's routing key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.responses import PlainTextResponse

from polar.engines.pool import FLAG_REPLICA_MOVED, routing_key
from polar.engines.registry import EngineConfig, create_engine
from polar.engines.scripted import Script, ScriptedBackend, create_scripted_app
from polar.engines.vllm import VLLMEngine
from polar.gateway.server import BackgroundServer
from polar.providers.types import NormalizedRequest
from pool_kit import MODEL, Gateway, assert_exact_single_chain, engines_of, new_sessions


def _replica(tokenizer: Any, cache: tuple[int, int] | None = None) -> BackgroundServer:
    """A scripted vLLM-shaped replica; ``cache`` (queries, hits) adds vLLM's /metrics."""
    backend = ScriptedBackend(Script(), tokenizer=tokenizer)
    app = create_scripted_app(backend)
    if cache is not None:
        text = VLLM_METRICS.format(queries=cache[0], hits=cache[1])
        app.router.add_route("/metrics", lambda _: PlainTextResponse(text), methods=["GET"])
    return BackgroundServer(app).start()


# vLLM 0.32's exposition of its two prefix-cache counters (prometheus_client text format).
VLLM_METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="SmolLM2-135M-Instruct"}} {queries}.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="SmolLM2-135M-Instruct"}} {hits}.0
"""


@pytest.fixture
def replicas(tokenizer: Any) -> Iterator[list[BackgroundServer]]:
    servers = [_replica(tokenizer), _replica(tokenizer)]
    yield servers
    for server in servers:
        if server.server.started and not server.server.should_exit:
            server.stop()


def test_every_call_of_a_session_stays_on_one_replica_and_sessions_spread(
    tmp_path: Path, replicas: list[BackgroundServer]
) -> None:
    gateway = Gateway(tmp_path / "c.db", [s.url for s in replicas])
    try:
        sessions = new_sessions(gateway, 4)
        gateway.rounds(sessions, 3)
        used = {key: set(engines_of(gateway.store, key)) for key in sessions}
        assert all(len(labels) == 1 for labels in used.values()), used
        per_replica = [
            sum(1 for u in used.values() if f"vllm@{s.host}:{s.port}" in u) for s in replicas
        ]
        assert per_replica == [2, 2]
        for key in sessions:
            assert_exact_single_chain(gateway.store, key)
    finally:
        gateway.close()


def test_a_replica_dying_mid_session_moves_its_sessions_and_contexts_stay_exact(
    tmp_path: Path, replicas: list[BackgroundServer]
) -> None:
    gateway = Gateway(tmp_path / "c.db", [s.url for s in replicas])
    try:
        sessions = new_sessions(gateway, 4)
        for key, messages in sessions.items():
            gateway.turn(key, messages)
        dead = f"vllm@{replicas[0].host}:{replicas[0].port}"
        alive = f"vllm@{replicas[1].host}:{replicas[1].port}"
        on_dead = [k for k in sessions if engines_of(gateway.store, k) == [dead]]
        assert len(on_dead) == 2
        replicas[0].stop()
        gateway.rounds(sessions, 2)
        for key in sessions:
            records = gateway.store.records(key)
            assert [r.engine for r in records[1:]] == [alive, alive]
            moved = [FLAG_REPLICA_MOVED in r.flags for r in records]
            assert moved == ([False, True, False] if key in on_dead else [False, False, False])
            assert_exact_single_chain(gateway.store, key)
    finally:
        gateway.close()


def test_affinity_survives_a_gateway_restart(
    tmp_path: Path, replicas: list[BackgroundServer]
) -> None:
    urls = [s.url for s in replicas]
    first = Gateway(tmp_path / "c.db", urls)
    sessions = new_sessions(first, 4)
    first.rounds(sessions, 1)
    before = {key: engines_of(first.store, key)[0] for key in sessions}
    first.close()
    # Listed the other way round: a fresh pool would place sessions differently.
    second = Gateway(tmp_path / "c.db", list(reversed(urls)))
    try:
        second.rounds(sessions, 1)
        for key in sessions:
            assert engines_of(second.store, key) == [before[key]] * 2
            assert not any(FLAG_REPLICA_MOVED in r.flags for r in second.store.records(key))
    finally:
        second.close()


async def test_an_external_router_gets_the_sessions_routing_key_in_its_own_header(
    tokenizer: Any,
) -> None:
    seen: list[httpx.Headers] = []
    app = create_scripted_app(ScriptedBackend(Script(), tokenizer=tokenizer))
    inner = httpx.ASGITransport(app=app)

    class Recording(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            seen.append(request.headers)
            return await inner.handle_async_request(request)

    config = EngineConfig(kind="vllm", router="sglang-router", base_url="http://router")
    engine = create_engine(config)
    assert isinstance(engine, VLLMEngine) and engine.routing_header == "X-SMG-Routing-Key"
    engine = VLLMEngine("http://router", transport=Recording(), routing_header="X-Session-ID")
    request = NormalizedRequest(
        provider="openai_chat",
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        session_id="ps-secret-session-key",
    )
    await engine.complete(request)
    await engine.complete_tokens([1, 2, 3], request)
    keys = [headers.get("x-session-id") for headers in seen]
    assert keys == [routing_key("ps-secret-session-key")] * 2
    assert "ps-secret-session-key" not in str(keys)  # the session id is the harness's API key
    await engine.aclose()


def test_pool_config_refuses_ambiguous_reach() -> None:
    with pytest.raises(ValueError, match="base_url or replicas"):
        EngineConfig(kind="vllm", base_url="http://a", replicas=["http://b"])
    with pytest.raises(ValueError, match="router routes by itself"):
        EngineConfig(kind="vllm", router="vllm-router", replicas=["http://b"])


def test_gateway_metrics_report_each_replicas_prefix_cache_hit_ratio_and_the_total(
    tmp_path: Path, tokenizer: Any
) -> None:
    servers = [_replica(tokenizer, (1000, 900)), _replica(tokenizer, (3000, 1500))]
    gateway = Gateway(tmp_path / "c.db", [s.url for s in servers])
    try:
        text = httpx.get(f"{gateway.server.url}/metrics", headers=gateway.admin).text
        ratios = {
            line.split('replica="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("polar_gateway_engine_prefix_cache_hit_ratio{")
        }
        names = [f"{s.host}:{s.port}" for s in servers]
        assert ratios == {names[0]: 0.9, names[1]: 0.5, "all": 2400 / 4000}
    finally:
        gateway.close()
        for server in servers:
            server.stop()


def test_a_closed_session_leaves_its_replica_and_the_table() -> None:
    from polar.engines.pool import EnginePool, Replica

    replicas = [Replica(name, VLLMEngine("http://127.0.0.1:9")) for name in ("a", "b")]
    pool = EnginePool(replicas)
    first, _ = pool._choose("s1")
    second, _ = pool._choose("s2")
    assert {first.name, second.name} == {"a", "b"}  # spread by open sessions
    pool.end_session("s1")
    assert pool.replica_for("s1") is None and first.sessions == 0
    third, _ = pool._choose("s3")
    assert third is first  # the closed session no longer weighs on its replica
    pool.end_session("never-seen")  # a session the pool never placed: nothing to release
    assert sum(r.sessions for r in replicas) == 2
