"""The rollout service against scripted nodes: dispatch, lost acks, refusals, death, restart."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from polar.delivery import RetryPolicy
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig
from polar.rollout.service import RolloutService
from polar.rollout.store import TaskConflict
from polar.schemas.node import (
    NodeReport,
    NodeSessionInfo,
    NodeStatus,
    SessionDispatch,
    Workers,
)
from polar.schemas.rollout import NodeView, ServerStatus, TaskCounts
from polar.schemas.task import (
    SessionFailure,
    SessionResult,
    SessionStatus,
    TaskRequest,
    TaskStatus,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeNodes:
    """Nodes and a trainer callback endpoint behind one httpx transport."""

    def __init__(self) -> None:
        self.dispatches: list[tuple[str, str]] = []  # (node, session_id) per POST
        self.started: dict[str, set[str]] = {}
        self.lose_first_acks = False  # every session's first acknowledgement is lost
        self._lost: set[str] = set()
        self.refusing: set[str] = set()  # nodes answering 429
        self.answers: list[int | bytes | Exception] = []  # the next dispatches' answers, any node
        self.callbacks: list[str] = []
        self.cancels: list[tuple[str, str]] = []  # (node, session_id) per DELETE
        self.cancel_answer: int | Exception = 200

    def __call__(self, request: httpx.Request) -> httpx.Response:
        node = request.url.host
        if node == "trainer":
            self.callbacks.append(request.headers["idempotency-key"])
            return httpx.Response(200)
        if request.url.path == "/polar/node/drain":
            return httpx.Response(200, json={})
        if request.method == "DELETE":
            self.cancels.append((node, request.url.path.rsplit("/", 1)[-1]))
            if isinstance(self.cancel_answer, Exception):
                raise self.cancel_answer
            return httpx.Response(self.cancel_answer, json={})
        dispatch = SessionDispatch.model_validate_json(request.content)
        sid = dispatch.session_id
        self.dispatches.append((node, sid))
        if self.answers:
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            if isinstance(answer, bytes):
                return httpx.Response(201, content=answer)
            return httpx.Response(answer, json={"detail": "scripted"})
        if node in self.refusing:
            return httpx.Response(429, json={"detail": "full"})
        self.started.setdefault(node, set()).add(sid)
        if self.lose_first_acks and sid not in self._lost:
            self._lost.add(sid)
            raise httpx.ReadTimeout("ack lost", request=request)
        info = NodeSessionInfo(
            session_id=sid,
            task_id=dispatch.task.task_id,
            node_id=node,
            status=SessionStatus.INITIALIZING,
            stage_started_at=0.0,
        )
        return httpx.Response(201, content=info.model_dump_json())


def report(node: str, run: int = 2, sessions: dict[str, SessionStatus] | None = None) -> NodeReport:
    status = NodeStatus(
        node_id=node,
        url=f"http://{node}",
        workers=Workers(init=1, run=run, postrun=1, ready_buffer=1, queue_limit=50),
    )
    return NodeReport(status=status, sessions=sessions or {})


def rollout_config(tmp_path: Path, **rollout: object) -> RolloutServerConfig:
    config = RolloutServerConfig(
        data_dir=tmp_path,
        dispatch_interval_s=0.01,
        dispatch_retry=RetryPolicy(initial_s=0.01, max_s=0.02, timeout_s=1),
        callback_retry=RetryPolicy(initial_s=0.01, max_s=0.02, deadline_s=2),
        heartbeat_timeout_s=5,
        node_grace_s=10,
        default_runtime="local",
        callback_hosts=["trainer"],
        **rollout,  # type: ignore[arg-type]
    )
    return config


async def until(check: Callable[[], bool], timeout: float = 3.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


@pytest.fixture
async def env(tmp_path: Path):
    nodes = FakeNodes()
    clock = Clock()
    services: list[RolloutService] = []

    async def make() -> RolloutService:
        client = httpx.AsyncClient(transport=httpx.MockTransport(nodes))
        service = RolloutService(rollout_config(tmp_path), client=client, clock=clock)
        await service.start()
        services.append(service)
        return service

    yield nodes, clock, make
    for service in services:
        if service._loops and not service._loops[0].done():
            await service.stop()


def result(sid: str, status: SessionStatus = SessionStatus.COMPLETED) -> SessionResult:
    return SessionResult(session_id=sid, task_id="t", status=status, reward=1.0, node_id="a")


def failure_of(service: RolloutService, session_id: str) -> SessionFailure | None:
    row = service.store.session(session_id)
    assert row is not None and row.result is not None
    return row.result.failure


def task(n: int = 4, **kw: object) -> TaskRequest:
    return TaskRequest(task_id="t", instruction="do", num_samples=n, **kw)  # type: ignore[arg-type]


async def test_task_flows_through_nodes_to_results_and_callbacks(env) -> None:
    nodes, _, make = env
    service = await make()
    await service.register(report("a"))
    await service.register(report("b"))
    summary, created = await service.submit(task(callback_url="http://trainer/cb"))
    assert created and summary.num_samples == 4 and summary.status == "RUNNING"
    with pytest.raises(TaskConflict):
        await service.submit(task())
    await until(lambda: len(nodes.dispatches) == 4)
    assert {n for n, _ in nodes.dispatches} == {"a", "b"}  # spread by run pressure
    views = service.session_views("t")
    await until(lambda: all(v.acknowledged for v in service.session_views("t")))
    for view in views:
        assert await service.accept_result(result(view.session_id))
    assert not await service.accept_result(result(views[0].session_id, SessionStatus.ERROR))
    final = service.task_result("t")
    assert final is not None and final.status == TaskStatus.COMPLETED and len(final.results) == 4
    await until(lambda: len(nodes.callbacks) == 4)
    await asyncio.sleep(0.05)
    assert sorted(nodes.callbacks) == sorted(v.session_id for v in views)


async def test_default_runtime_applies_only_when_the_task_names_none(env) -> None:
    _, _, make = env
    service = await make()
    await service.submit(task(n=1))
    assert service._request("t").runtime.kind == "local"
    named = TaskRequest.model_validate(
        {"task_id": "u", "instruction": "x", "runtime": {"kind": "bubblewrap"}}
    )
    await service.submit(named)
    assert service._request("u").runtime.kind == "bubblewrap"


async def test_lost_ack_is_retried_to_the_same_node_only(env) -> None:
    nodes, _, make = env
    service = await make()
    await service.register(report("a"))
    await service.register(report("b"))
    nodes.lose_first_acks = True
    await service.submit(task(n=2))
    sids = [v.session_id for v in service.session_views("t")]
    await until(lambda: all(v.acknowledged for v in service.session_views("t")))
    for sid in sids:
        posts = [n for n, s in nodes.dispatches if s == sid]
        assert len(posts) == 2 and len(set(posts)) == 1  # resent, same node


async def test_refusal_puts_the_session_back_for_another_node(env) -> None:
    nodes, _, make = env
    service = await make()
    nodes.refusing.add("a")
    await service.register(report("a", run=8))  # least pressure: chosen first, but refuses
    await service.register(report("b", run=1))
    await service.submit(task(n=1))
    await until(lambda: service.session_views("t")[0].acknowledged)
    assert service.session_views("t")[0].node_id == "b"
    assert [n for n, _ in nodes.dispatches][:1] == ["a"]


async def test_dead_node_sessions_fail_after_grace_and_task_completes(env) -> None:
    _, clock, make = env
    service = await make()
    await service.register(report("a"))
    await service.submit(task(n=2))
    await until(lambda: all(v.acknowledged for v in service.session_views("t")))
    clock.now += 6  # unhealthy: no new sessions
    assert not service.node_views()[0].healthy
    assert await service.expire_nodes() == []
    clock.now += 5  # past the grace period
    assert await service.expire_nodes() == ["a"]
    final = service.task_result("t")
    assert final is not None and final.status == TaskStatus.COMPLETED
    assert {r.status for r in final.results} == {SessionStatus.ERROR}
    assert "no heartbeat for 10s" in (final.results[0].error or "")
    assert {r.failure for r in final.results} == {SessionFailure(kind="infra", reason="node_dead")}
    # The node comes back late with a real result: acknowledged, not applied.
    assert not await service.accept_result(result(final.results[0].session_id))


async def test_restart_answers_finished_tasks_and_resumes_unacked(env) -> None:
    nodes, _, make = env
    first = await make()
    await first.register(report("a"))
    await first.submit(task(n=2, callback_url="http://trainer/cb"))
    await until(lambda: all(v.acknowledged for v in first.session_views("t")))
    sids = [v.session_id for v in first.session_views("t")]
    await first.accept_result(result(sids[0]))
    await until(lambda: len(nodes.callbacks) == 1)
    await first.stop()

    second = await make()
    summary = second.summary("t")
    assert summary is not None and summary.counts["COMPLETED"] == 1
    # The node re-registers holding only the unfinished session: nothing is failed.
    await second.register(report("a", sessions={sids[1]: SessionStatus.RUNNING}))
    assert second.session_views("t")[1].status == SessionStatus.RUNNING
    await second.accept_result(result(sids[1]))
    final = second.task_result("t")
    assert final is not None and final.status == TaskStatus.COMPLETED
    await until(lambda: len(nodes.callbacks) == 2)
    assert sorted(nodes.callbacks) == sorted(sids)  # the first was not sent again


async def test_a_node_that_restarted_loses_its_acknowledged_sessions(env) -> None:
    _, _, make = env
    service = await make()
    await service.register(report("a"))
    await service.submit(task(n=1))
    await until(lambda: service.session_views("t")[0].acknowledged)
    await service.register(report("a"))  # a fresh node process knows nothing
    view = service.session_views("t")[0]
    assert view.status == SessionStatus.ERROR and "restarted" in (view.error or "")
    assert failure_of(service, view.session_id) == SessionFailure(
        kind="infra", reason="node_restarted"
    )


async def test_server_errors_are_retried_to_the_same_node(env) -> None:
    nodes, _, make = env
    service = await make()
    await service.register(report("a"))
    await service.register(report("b"))
    nodes.answers = [500, 502, 504]
    await service.submit(task(n=1))
    await until(lambda: service.session_views("t")[0].acknowledged)
    assert len(nodes.dispatches) == 4 and len({n for n, _ in nodes.dispatches}) == 1


async def test_a_node_answering_503_then_201_gets_the_session(env) -> None:
    nodes, _, make = env
    service = await make()
    await service.register(report("a"))
    nodes.answers = [503]  # refused: back to the queue, then dispatched again
    await service.submit(task(n=1))
    await until(lambda: service.session_views("t")[0].acknowledged)
    assert [n for n, _ in nodes.dispatches] == ["a", "a"]
    assert service.session_views("t")[0].status == SessionStatus.INITIALIZING


async def test_a_client_error_fails_the_session_at_once(env) -> None:
    nodes, _, make = env
    service = await make()
    await service.register(report("a"))
    nodes.answers = [400]
    await service.submit(task(n=1))
    await until(lambda: service.summary("t").status == TaskStatus.COMPLETED)  # type: ignore[union-attr]
    view = service.session_views("t")[0]
    assert view.status == SessionStatus.ERROR and "HTTP 400" in (view.error or "")
    assert failure_of(service, view.session_id) == SessionFailure(
        kind="infra", reason="dispatch_rejected"
    )
    await until(lambda: not service._sending)
    assert len(nodes.dispatches) == 1


async def test_dispatch_stops_when_its_node_dies(env) -> None:
    nodes, clock, make = env
    service = await make()
    await service.register(report("a"))
    nodes.answers = [500] * 10_000
    await service.submit(task(n=1))
    await until(lambda: len(nodes.dispatches) >= 3)
    clock.now += 11  # past the grace period
    assert await service.expire_nodes() == ["a"]
    await until(lambda: not service._sending)
    sent = len(nodes.dispatches)
    await asyncio.sleep(0.05)
    assert len(nodes.dispatches) == sent
    view = service.session_views("t")[0]
    assert view.status == SessionStatus.ERROR and "no heartbeat" in (view.error or "")


@pytest.mark.parametrize(
    "answer", [ValueError("a bug, not the network"), b"a garbled acknowledgement"]
)
async def test_an_unexpected_error_in_a_dispatch_fails_the_session_loudly(
    env, answer: bytes | Exception, caplog: pytest.LogCaptureFixture
) -> None:
    nodes, _, make = env
    service = await make()
    await service.register(report("a"))
    nodes.answers = [answer]
    await service.submit(task(n=1))
    await until(lambda: service.summary("t").status == TaskStatus.COMPLETED)  # type: ignore[union-attr]
    view = service.session_views("t")[0]
    assert view.status == SessionStatus.ERROR and "dispatch of" in (view.error or "")
    assert failure_of(service, view.session_id) == SessionFailure(
        kind="infra", reason="dispatch_failed"
    )
    await until(lambda: not service._sending)
    assert len(nodes.dispatches) == 1
    assert any("broke; failing the session" in r.getMessage() for r in caplog.records)


async def test_status_is_a_typed_model_and_the_endpoint_answers_its_json(env) -> None:
    nodes, _, make = env
    service = await make()
    await service.register(report("a"))
    await service.submit(task(n=2))
    await until(lambda: len(nodes.dispatches) == 2)
    status = service.status()
    assert isinstance(status, ServerStatus)
    assert status.tasks == TaskCounts(running=1, total=1)
    assert [n.node_id for n in status.nodes] == ["a"]
    assert sum(status.sessions.values()) == 2
    app = create_rollout_app(service.config, service=service)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://rollout",
        headers={"authorization": f"Bearer {service.access.admin_token}"},
    ) as client:
        answer = (await client.get("/status")).json()
    assert set(answer) == {
        "nodes",
        "tasks",
        "sessions",
        "dispatching",
        "callbacks_in_flight",
        "event_subscribers",
    }
    assert answer["tasks"] == {"running": 1, "total": 1}
    assert answer["sessions"] == status.sessions
    assert set(answer["nodes"][0]) == set(NodeView.model_fields)
    assert ServerStatus.model_validate(answer).nodes[0].node_id == "a"
