"""The rollout server's metrics against scripted nodes: every dispatch outcome (refused, retried
on a 5xx or no answer, rejected, a broken answer, delivered), sessions by status, callbacks,
and nodes by state as heartbeats stop (healthy, draining, silent, dead), counted exactly."""

from __future__ import annotations

import httpx

from metrics_scrape import Samples, parse, total, value
from polar.rollout.service import RolloutService
from polar.schemas.task import SessionStatus
from unit.rollout.test_service import env, report, result, task, until

__all__ = ["env"]  # the fixture, shared with test_service


async def scrape(service: RolloutService) -> Samples:
    response = await service.metrics_response()
    assert response.media_type is not None and response.media_type.startswith("text/plain")
    return parse(bytes(response.body).decode())


async def test_every_dispatch_outcome_is_counted(env) -> None:
    nodes, _, make = env
    service = await make()
    await service.register(report("a"))
    # One session: refused (back to the queue), a 5xx, no answer, then delivered.
    nodes.answers = [429, 500, httpx.ConnectError("node unreachable")]
    await service.submit(task(n=1, callback_url="http://trainer/cb"))
    await until(lambda: service.session_views("t")[0].acknowledged)
    [view] = service.session_views("t")
    await service.accept_result(result(view.session_id))
    await until(lambda: len(nodes.callbacks) == 1)
    m = await scrape(service)
    attempts = "polar_rollout_dispatch_attempts_total"
    assert value(m, attempts, outcome="refused") == 1
    assert value(m, attempts, outcome="retry") == 2
    assert value(m, attempts, outcome="delivered") == 1
    assert total(m, attempts) == 4
    # Three attempts were answered (429, 500, 201); the unreachable one has no duration.
    assert value(m, "polar_rollout_dispatch_duration_seconds_count") == 3
    assert value(m, "polar_rollout_tasks_submitted_total") == 1
    assert value(m, "polar_rollout_tasks_completed_total") == 1
    assert value(m, "polar_rollout_task_duration_seconds_count") == 1
    assert value(m, "polar_rollout_sessions_finished_total", status="COMPLETED") == 1
    assert value(m, "polar_rollout_sessions", status="COMPLETED") == 1
    await until(lambda: service.callbacks.pending == 0)
    m = await scrape(service)
    assert value(m, "polar_rollout_callbacks_total", state="delivered") == 1
    assert value(m, "polar_rollout_callback_retries_total") == 0

    # A 4xx rejects the session, a garbled acknowledgement breaks it: both fail it.
    nodes.answers = [404, b"not a session"]
    await service.submit(task(n=2).model_copy(update={"task_id": "u"}))
    await until(lambda: service.summary("u") is not None and service.summary("u").status.final)
    m = await scrape(service)
    assert value(m, attempts, outcome="rejected") == 1
    assert value(m, attempts, outcome="error") == 1
    assert value(m, "polar_rollout_sessions_finished_total", status="ERROR") == 2
    assert value(m, "polar_rollout_sessions", status="ERROR") == 2
    assert value(m, "polar_rollout_tasks_completed_total") == 2


async def test_sessions_by_status_and_nodes_by_state(env) -> None:
    _, clock, make = env
    service = await make()
    await service.register(report("a", run=3))
    await service.register(report("b"))
    await service.submit(task(n=2))
    await until(lambda: all(v.acknowledged for v in service.session_views("t")))
    m = await scrape(service)
    assert value(m, "polar_rollout_sessions", status="INITIALIZING") == 2
    assert value(m, "polar_rollout_sessions", status="COMPLETED") == 0
    assert value(m, "polar_rollout_nodes", state="healthy") == 2
    assert value(m, "polar_rollout_node_workers", node_id="a", pool="run") == 3
    assert value(m, "polar_rollout_node_capacity", node_id="a") > 0

    await service.drain("b")
    m = await scrape(service)
    assert value(m, "polar_rollout_nodes", state="healthy") == 1
    assert value(m, "polar_rollout_nodes", state="draining") == 1

    clock.now += 6  # past the heartbeat timeout: silent, not dead yet
    await service.heartbeat(report("a", run=3, sessions=_statuses(service, "a")))
    m = await scrape(service)
    assert value(m, "polar_rollout_nodes", state="healthy") == 1
    assert value(m, "polar_rollout_nodes", state="silent") == 1

    clock.now += 11  # past the grace period for both
    await service.expire_nodes()
    m = await scrape(service)
    assert value(m, "polar_rollout_nodes", state="dead") == 2
    assert total(m, "polar_rollout_nodes") == 2
    assert total(m, "polar_rollout_node_sessions") == 0  # a dead node's pools are not shown
    assert value(m, "polar_rollout_sessions", status="ERROR") == 2


def _statuses(service: RolloutService, node_id: str) -> dict[str, SessionStatus]:
    return {v.session_id: v.status for v in service.session_views("t") if v.node_id == node_id}


async def test_sampled_tokens_are_counted_delivered_or_lost_by_reason(env) -> None:
    from polar.schemas.task import SessionFailure
    from polar.schemas.trajectory import Trajectory, TrajectoryStatus

    _, _, make = env
    service = await make()
    await service.register(report("a"))
    await service.submit(task(n=3))
    await until(lambda: all(v.acknowledged for v in service.session_views("t")))
    counted = {"sampled_tokens": 10, "delivered_tokens": 8, "lost": {"side_call": 2}}
    built = Trajectory(status=TrajectoryStatus.COMPLETED, metadata={"delivery": counted})
    done, timed_out, errored = (v.session_id for v in service.session_views("t"))
    await service.accept_result(result(done).model_copy(update={"trajectory": built}))
    late = result(timed_out, SessionStatus.TIMEOUT).model_copy(update={"trajectory": built})
    await service.accept_result(late)
    failed = result(errored, SessionStatus.ERROR).model_copy(
        update={"trajectory": built, "failure": SessionFailure(kind="evaluator")}
    )
    await service.accept_result(failed)
    m = await scrape(service)
    assert value(m, "polar_rollout_sampled_tokens_total") == 30
    assert value(m, "polar_rollout_delivered_tokens_total") == 8
    lost = "polar_rollout_lost_tokens_total"
    assert value(m, lost, reason="side_call") == 6
    assert value(m, lost, reason="timeout") == 8
    assert value(m, lost, reason="evaluator_failure") == 8
    assert value(m, lost, reason="stale") == 0  # every reason is exported, zero or not
    assert total(m, lost) == 22
    assert service.metrics.delivery.fraction == 8 / 30
