"""Observed node loss and drain deadlines: sessions end at once with failure kind infra, naming
the node, instead of after the grace period (which is ten seconds of fake clock away here)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from polar.gateway.server import BackgroundServer
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig
from polar.schemas.task import SessionStatus, TaskStatus

from .test_service import env, report, result, task, until  # noqa: F401  (env: a fixture)


async def test_a_lost_node_fails_its_sessions_at_once_as_infra(env) -> None:  # noqa: F811
    _, _, make = env
    service = await make()
    await service.register(report("a", run=1))
    await service.register(report("b", run=1))
    await service.submit(task(n=2))
    await until(lambda: all(v.acknowledged for v in service.session_views("t")))
    on_a = [v.session_id for v in service.session_views("t") if v.node_id == "a"]
    on_b = [v.session_id for v in service.session_views("t") if v.node_id == "b"]
    assert on_a and on_b

    assert await service.node_lost("a", "Ray reports the node dead") == len(on_a)
    rows = {sid: service.store.session(sid) for sid in on_a + on_b}
    for sid in on_a:
        lost = rows[sid].result  # type: ignore[union-attr]
        assert lost is not None and lost.status == SessionStatus.ERROR
        assert lost.failure is not None and lost.failure.kind == "infra"
        assert lost.failure.reason == "node_lost"
        assert "node a lost (Ray reports the node dead)" in (lost.error or "")
    assert all(not rows[sid].status.finished for sid in on_b)  # type: ignore[union-attr]  # the other node is untouched
    views = {v.node_id: v for v in service.node_views()}
    assert views["a"].dead and not views["b"].dead
    assert await service.node_lost("a", "again") == 0  # idempotent: nothing left to fail
    assert await service.node_lost("nope", "typo") is None

    await service.accept_result(result(on_b[0]))
    final = service.task_result("t")
    assert final is not None and final.status == TaskStatus.COMPLETED


async def test_a_lost_node_that_comes_back_registers_afresh_and_gets_work(env) -> None:  # noqa: F811
    nodes, _, make = env
    service = await make()
    await service.register(report("a"))
    await service.node_lost("a", "gone")
    assert await service.heartbeat(report("a")) is None  # must register again
    await service.register(report("a"))
    await service.submit(task(n=1))
    await until(lambda: service.session_views("t")[0].acknowledged)
    assert [n for n, _ in nodes.dispatches] == ["a"]


async def test_drain_with_a_deadline_fails_what_is_left_as_infra(env) -> None:  # noqa: F811
    _, _, make = env
    service = await make()
    await service.register(report("a"))
    await service.submit(task(n=2))
    await until(lambda: all(v.acknowledged for v in service.session_views("t")))
    first, second = (v.session_id for v in service.session_views("t"))
    await service.drain("a", deadline_s=0.3)
    await service.accept_result(result(first))  # finished in time: kept as it is
    assert service.session_views("t")[1].status != SessionStatus.ERROR
    await until(lambda: service.session_views("t")[1].status == SessionStatus.ERROR)
    kept, cancelled = service.store.session(first), service.store.session(second)
    assert kept is not None and cancelled is not None
    late = cancelled.result
    assert late is not None and late.failure is not None
    assert (late.failure.kind, late.failure.reason) == ("infra", "drain_deadline")
    assert "0.3s deadline" in (late.error or "")
    assert kept.status == SessionStatus.COMPLETED
    # The node hears on its next heartbeat that the session is over, and stops it.
    answer = await service.heartbeat(report("a", sessions={second: SessionStatus.RUNNING}))
    assert answer is not None and answer.retired == [second]


def test_lost_is_admin_only_over_http(tmp_path: Path) -> None:
    config = RolloutServerConfig(data_dir=tmp_path, admin_token="a" * 32)
    with BackgroundServer(create_rollout_app(config)) as server:
        url = f"{server.url}/nodes/n1/lost"
        assert httpx.post(url, json={"reason": "x"}, timeout=5).status_code == 401
        admin = {"authorization": f"Bearer {'a' * 32}"}
        assert httpx.post(url, json={"reason": "x"}, headers=admin, timeout=5).status_code == 404
        drain = f"{server.url}/nodes/n1/drain?deadline_s=-1"
        assert httpx.post(drain, headers=admin, timeout=5).status_code == 422


async def test_silence_past_grace_is_infra_too(env) -> None:  # noqa: F811
    _, clock, make = env
    service = await make()
    await service.register(report("a"))
    await service.submit(task(n=1))
    await until(lambda: service.session_views("t")[0].acknowledged)
    clock.now += 11
    assert await service.expire_nodes() == ["a"]
    await asyncio.sleep(0)
    row = service.store.session(service.session_views("t")[0].session_id)
    assert row is not None and row.result is not None and row.result.failure is not None
    assert row.result.failure.kind == "infra"


async def test_a_drained_node_is_drained_not_dead_and_old_nodes_are_forgotten(env) -> None:  # noqa: F811
    """`polar ray status` separates the two: a node drained and stopped (by its provider, or
    silent past the grace owing nothing) is drained; a node lost is dead. Both leave the list
    ``forget_nodes_s`` after they went."""
    _, clock, make = env
    service = await make()
    for node in ("retired", "quiet", "lost"):
        await service.register(report(node))
    await service.drain("retired")
    await service.drain("quiet")
    await service.node_retired("retired")  # the Ray provider stopped its gateway
    await service.node_lost("lost", "Ray reports its node dead")
    clock.now += 11  # "quiet" was stopped by hand: silent past the grace, owing nothing
    assert await service.expire_nodes() == ["quiet"]
    views = {v.node_id: v for v in service.node_views()}
    assert (views["retired"].drained, views["retired"].dead) == (True, False)
    assert (views["quiet"].drained, views["quiet"].dead) == (True, False)
    assert (views["lost"].drained, views["lost"].dead) == (False, True)
    assert {service.node_state(r) for r in service.nodes.all()} == {"drained", "dead"}

    clock.now += service.config.forget_nodes_s + 1
    await service.expire_nodes()
    assert service.node_views() == []


async def test_a_node_stopped_while_draining_with_work_left_fails_it_as_infra(env) -> None:  # noqa: F811
    _, _, make = env
    service = await make()
    await service.register(report("a"))
    await service.submit(task(n=1))
    await until(lambda: service.session_views("t")[0].acknowledged)
    await service.drain("a")
    await service.node_retired("a")
    await asyncio.sleep(0)
    row = service.store.session(service.session_views("t")[0].session_id)
    assert row is not None and row.result is not None and row.result.failure is not None
    assert (row.result.failure.kind, row.result.failure.reason) == ("infra", "drain_deadline")
    assert service.node_views()[0].drained
