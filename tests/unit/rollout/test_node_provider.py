"""The Ray node provider's reconciling against a fake node list (no Ray): one gateway per
eligible alive node, a dead node reported lost once, a gateway gone past its restarts on a live
node reported lost at once and replaced (with a backoff when it keeps dying), a joining node
placed, a drained node retired and never placed again (across a restart of the server too),
unsandboxed runtimes refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polar.ray.actors import GatewaySpec, auto_workers, gateway_node_id
from polar.ray.config import PolarRayConfig, RaySection
from polar.ray.provider import RayNodeProvider
from polar.rollout.node_provider import StaticProvider, node_providers
from polar.schemas.task import TaskRequest

HEAD, A, B, C = ("h" * 28, "a" * 28, "b" * 28, "c" * 28)


class FakeCluster:
    def __init__(self) -> None:
        self.alive: dict[str, dict[str, float]] = {
            HEAD: {"polar_rollout": 1.0, "CPU": 8.0},
            A: {"polar_gateway": 1.0},
            B: {"polar_gateway": 1.0},
        }
        self.dead: set[str] = set()
        self.actors: set[str] = set()

    def nodes(self) -> list[dict[str, Any]]:
        live = [{"NodeID": n, "Alive": True, "Resources": r} for n, r in self.alive.items()]
        return live + [{"NodeID": n, "Alive": False, "Resources": {}} for n in self.dead]

    def existing(self) -> set[str]:
        return set(self.actors)

    def gateway_names(self) -> set[str]:
        return {f"polar-gw-{n[:12]}" for n in self.actors}

    def place(self, ray_node: str, spec: GatewaySpec) -> None:
        assert ray_node not in self.actors, "placed twice"
        self.actors.add(ray_node)

    def remove(self, ray_node: str) -> None:
        self.actors.discard(ray_node)

    def kill_node(self, ray_node: str) -> None:
        del self.alive[ray_node]
        self.dead.add(ray_node)

    def spend_gateway(self, ray_node: str) -> None:
        """The gateway died past its max_restarts: Ray forgets its name, the node lives."""
        self.actors.remove(ray_node)


class FakeHost:
    def __init__(self) -> None:
        self.lost: list[tuple[str, str]] = []
        self.retired: list[str] = []
        self.owed: dict[str, int] = {}
        self.forgotten: list[str] = []

    async def node_lost(self, node_id: str, reason: str) -> int | None:
        self.lost.append((node_id, reason))
        return 0

    async def node_retired(self, node_id: str) -> None:
        self.retired.append(node_id)

    def unfinished_on(self, node_id: str) -> int:
        return self.owed.get(node_id, 0)

    async def forget_credential(self, node_id: str) -> None:
        self.forgotten.append(node_id)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def provider(
    tmp_path: Path, cluster: FakeCluster, clock: Clock | None = None, **section: Any
) -> RayNodeProvider:
    config = RaySection.model_validate({"address": "auto", **section})
    spec = GatewaySpec(gateways=config.gateways, rollout_url="http://r:1", enrolment_secret="s")
    return RayNodeProvider(
        config,
        spec,
        state_dir=tmp_path,
        cluster=cluster,  # type: ignore[arg-type]
        clock=clock or Clock(),
    )


async def test_one_gateway_per_eligible_node_and_a_dead_node_is_lost_once(tmp_path: Path) -> None:
    cluster, host = FakeCluster(), FakeHost()
    p = provider(tmp_path, cluster)
    p.host = host
    assert await p.reconcile() == []
    assert cluster.actors == {A, B}  # never the head: it lacks polar_gateway
    assert await p.reconcile() == [] and cluster.actors == {A, B}  # idempotent

    cluster.kill_node(A)
    assert await p.reconcile() == [gateway_node_id(A)]
    assert host.lost == [(gateway_node_id(A), "Ray reports its node dead")]
    assert await p.reconcile() == [] and len(host.lost) == 1
    assert cluster.actors == {B}

    cluster.alive[C] = {"polar_gateway": 1.0}  # a node joins
    await p.reconcile()
    assert cluster.actors == {B, C}


async def test_a_gateway_gone_past_its_restarts_is_lost_at_once_and_replaced(
    tmp_path: Path,
) -> None:
    cluster, host, clock = FakeCluster(), FakeHost(), Clock()
    p = provider(tmp_path, cluster, clock, gateways={"max_restarts": 3})
    p.host = host
    await p.reconcile()
    node = gateway_node_id(A)

    cluster.spend_gateway(A)
    assert await p.reconcile() == []  # one round could race a listing: not yet
    assert await p.reconcile() == [node]  # two: gone for good, its node still alive
    [(lost, reason)] = host.lost
    assert lost == node and "restarts" in reason and "max_restarts 3" in reason
    assert cluster.actors == {B}  # the loss is reported before a replacement exists
    assert host.forgotten == [node]  # and its credential revoked before one is placed
    assert await p.reconcile() == [] and len(host.lost) == 1
    assert host.forgotten == [node]
    assert cluster.actors == {A, B}  # a fresh gateway on the same node, the next round

    # It dies again at once: replaced only after a backoff (a gateway that cannot start must
    # not spin), and the backoff doubles.
    for delay in (5.0, 10.0):
        cluster.spend_gateway(A)
        await p.reconcile()
        await p.reconcile()
        await p.reconcile()
        assert A not in cluster.actors and host.lost[-1][0] == node
        clock.now += delay - 0.5
        await p.reconcile()
        assert A not in cluster.actors
        clock.now += 0.5
        await p.reconcile()
        assert A in cluster.actors
    assert len(host.lost) == 3

    # One that lived long enough starts the count again: replaced at once.
    clock.now += 3600
    cluster.spend_gateway(A)
    for _ in range(3):
        await p.reconcile()
    assert A in cluster.actors and len(host.lost) == 4
    assert host.forgotten == [node] * 4


async def test_a_restarting_gateway_is_not_lost(tmp_path: Path) -> None:
    """Ray keeps a restarting actor's name: nothing is reported, nothing placed twice."""
    cluster, host = FakeCluster(), FakeHost()
    p = provider(tmp_path, cluster)
    p.host = host
    for _ in range(5):
        assert await p.reconcile() == []
    assert host.lost == [] and cluster.actors == {A, B}


async def test_loss_is_not_reported_when_switched_off(tmp_path: Path) -> None:
    cluster, host = FakeCluster(), FakeHost()
    p = provider(tmp_path, cluster, report_node_loss=False)
    p.host = host
    await p.reconcile()
    cluster.kill_node(B)
    assert await p.reconcile() == [gateway_node_id(B)]
    assert host.lost == []


async def test_a_drained_node_keeps_its_gateway_until_done_and_never_gets_one_again(
    tmp_path: Path,
) -> None:
    cluster, host = FakeCluster(), FakeHost()
    p = provider(tmp_path, cluster)
    p.host = host
    await p.reconcile()
    node = gateway_node_id(A)
    host.owed[node] = 2
    assert p.retire(node, None) and not p.retire("ray-unknown", None)
    await p.reconcile()
    assert A in cluster.actors  # still finishing its sessions
    assert host.retired == []
    host.owed[node] = 0
    await p.reconcile()
    assert cluster.actors == {B}
    assert host.retired == [node]  # drained now, not dead after the grace period
    await p.reconcile()
    assert cluster.actors == {B} and host.retired == [node] and host.lost == []

    # A restarted rollout server remembers the drain (its data dir) and finds B's gateway.
    again = provider(tmp_path, cluster)
    again.host = host
    again.placed |= cluster.existing()
    await again.reconcile()
    assert cluster.actors == {B}


async def test_a_drain_deadline_retires_the_gateway_even_if_it_still_owes(tmp_path: Path) -> None:
    cluster, host = FakeCluster(), FakeHost()
    p = provider(tmp_path, cluster)
    p.host = host
    await p.reconcile()
    host.owed[gateway_node_id(A)] = 1
    p.retire(gateway_node_id(A), -5.0)  # the deadline (and its margin) already passed
    await p.reconcile()
    assert cluster.actors == {B}


def test_unsandboxed_runtimes_are_refused_unless_allowed(tmp_path: Path) -> None:
    local = TaskRequest.model_validate(
        {"task_id": "t", "instruction": "x", "runtime": {"kind": "local"}}
    )
    bwrap = TaskRequest.model_validate(
        {"task_id": "t", "instruction": "x", "runtime": {"kind": "bubblewrap"}}
    )
    strict = provider(tmp_path, FakeCluster())
    assert "allow_unsandboxed" in (strict.refuse(local) or "")
    assert strict.refuse(bwrap) is None
    loose = provider(tmp_path, FakeCluster(), gateways={"allow_unsandboxed": True})
    assert loose.refuse(local) is None
    assert StaticProvider().refuse(local) is None
    assert isinstance(node_providers.create("static"), StaticProvider)


def test_the_config_is_strict_and_never_starts_a_cluster_unasked(monkeypatch: Any) -> None:
    import pytest

    from polar.errors import ConfigError

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError, match="never starts a Ray cluster"):
        PolarRayConfig().ray.resolved_address()
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert PolarRayConfig().ray.resolved_address() == "10.0.0.1:6379"
    with pytest.raises(ConfigError, match="gatways"):
        PolarRayConfig.parse({"ray": {"gatways": {}}})
    with pytest.raises(ConfigError, match="allow_unsandboxed"):
        PolarRayConfig.parse({"defaults": {"runtime": "local"}})
    assert PolarRayConfig.parse(
        {"defaults": {"runtime": "local"}, "ray": {"gateways": {"allow_unsandboxed": True}}}
    )


def test_auto_workers_follow_the_node_cores() -> None:
    assert auto_workers(16).run == 16 and auto_workers(16).init == 4
    assert auto_workers(1).run == 1 and auto_workers(1).ready_buffer == 1


def test_the_ray_provider_is_registered_by_polar_ray_not_by_the_rollout_server() -> None:
    import polar.ray.provider as ray_provider

    assert node_providers.get("ray") is ray_provider.RayNodeProvider
