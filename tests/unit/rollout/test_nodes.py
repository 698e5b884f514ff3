"""Node registry: health from heartbeats, draining, death after the grace period (once)."""

from __future__ import annotations

from polar.rollout.nodes import NodeRegistry
from polar.schemas.node import NodeStatus, StageCounts, Workers


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def status(node_id: str = "n1", running: int = 0, draining: bool = False) -> NodeStatus:
    return NodeStatus(
        node_id=node_id,
        url=f"http://{node_id}",
        draining=draining,
        workers=Workers(init=1, run=2, postrun=1, ready_buffer=1, queue_limit=5),
        stages=StageCounts(running=running, queued=1),
    )


def test_health_follows_heartbeats_and_death_is_reported_once() -> None:
    clock = Clock()
    registry = NodeRegistry(heartbeat_timeout_s=3, grace_s=10, clock=clock)
    registry.register(status())
    assert [load.healthy for load in registry.loads()] == [True]
    clock.now += 4
    assert [load.healthy for load in registry.loads()] == [False]
    assert registry.expire() == []
    registry.heartbeat(status(running=2))
    load = registry.loads()[0]
    assert load.healthy and load.before_run == 3 and load.capacity == 2
    clock.now += 11
    assert registry.expire() == ["n1"]
    assert registry.expire() == []
    assert registry.heartbeat(status()) is None  # dead: must register again
    registry.register(status())
    assert registry.loads()[0].healthy


def test_dead_and_drained_nodes_are_forgotten_after_forget_s() -> None:
    clock = Clock()
    registry = NodeRegistry(3, 10, clock=clock, forget_s=100)
    for node_id in ("quiet", "lost", "retired", "live"):
        registry.register(status(node_id))
    clock.now += 5
    assert registry.declare_dead("lost")
    assert registry.declare_dead("retired", drained=True)
    assert not registry.declare_dead("retired")  # once
    retired = registry.get("retired")
    assert retired is not None and retired.dead and retired.drained
    clock.now += 6
    registry.heartbeat(status("live"))
    assert registry.expire() == ["quiet"]
    clock.now += 95  # "lost" and "retired" died 101 s ago, "quiet" 95 s ago
    registry.heartbeat(status("live"))
    registry.expire()
    assert sorted(r.node_id for r in registry.all()) == ["live", "quiet"]
    clock.now += 6
    registry.heartbeat(status("live"))
    registry.expire()
    assert [r.node_id for r in registry.all()] == ["live"]
    registry.register(status("lost"))  # a forgotten node registers afresh
    assert registry.live("lost")


def test_unknown_node_heartbeat_is_refused() -> None:
    registry = NodeRegistry(3, 10, clock=Clock())
    assert registry.heartbeat(status("ghost")) is None


def test_drain_is_kept_across_re_registration_and_excludes_the_node() -> None:
    registry = NodeRegistry(3, 10, clock=Clock())
    registry.register(status())
    registry.drain("n1")
    registry.register(status())
    load = registry.loads()[0]
    assert load.draining and not load.eligible
    registry.register(status("n2", draining=True))
    assert registry.get("n2").draining  # type: ignore[union-attr]
    assert registry.drain("nope") is None


def test_expected_node_that_never_returns_dies_after_grace() -> None:
    clock = Clock()
    registry = NodeRegistry(3, 10, clock=clock)
    registry.expect("old")
    assert registry.loads() == []  # nothing to schedule on
    clock.now += 5
    registry.register(status("back"))
    clock.now += 6
    assert registry.expire() == ["old"]


def test_a_node_url_must_be_one_an_http_client_can_call() -> None:
    import httpx
    import pytest
    from pydantic import ValidationError

    workers = Workers(init=1, run=1, postrun=1, ready_buffer=0, queue_limit=1)
    for url in ("http://[::1]:8080", "https://[2001:db8::7]/polar", "http://10.0.0.5:9"):
        NodeStatus(node_id="n", url=url, workers=workers)
        httpx.URL(url)  # what the rollout server will dispatch to
    for url in ("http://[2FD]:80", "http://[:::]", "http://h:0", "ftp://h", "http://h:99999"):
        with pytest.raises(ValidationError):
            NodeStatus(node_id="n", url=url, workers=workers)
