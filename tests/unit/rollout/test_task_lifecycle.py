"""A task's lifecycle on the rollout server: resubmitting an id (the same request answers the
existing task, a different one is refused, never replaced), cancelling (DELETE /tasks/{id}),
and the failure invariant: every ERROR or TIMEOUT result names its failure kind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from polar.client import RolloutClient
from polar.client.async_client import RolloutError
from polar.gateway.server import BackgroundServer
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig
from polar.rollout.service import RolloutService
from polar.schemas.task import (
    SessionFailure,
    SessionResult,
    SessionStatus,
    TaskRequest,
    TaskResult,
    TaskStatus,
)

from .test_service import env, failure_of, report, task, until  # noqa: F401  (env: a fixture)

CANCELLED = SessionFailure(kind="infra", reason="cancelled")


async def test_cancel_ends_sessions_no_node_holds_at_once(env) -> None:  # noqa: F811
    nodes, _, make = env
    service: RolloutService = await make()
    await service.submit(task(n=3))  # no node registered: nothing is bound
    summary = await service.cancel("t")
    assert summary is not None and summary.status == TaskStatus.COMPLETED
    assert summary.counts == {"ERROR": 3}
    final = service.task_result("t")
    assert final is not None
    assert {(r.status, r.error, r.failure) for r in final.results} == {
        (SessionStatus.ERROR, "cancelled", CANCELLED)
    }
    assert nodes.cancels == [] and nodes.dispatches == []
    await service.register(report("a"))  # a node now: nothing cancelled is dispatched
    assert await service.dispatch_once() == 0
    assert await service.cancel("missing") is None


async def test_cancel_asks_the_holding_node_and_its_report_ends_the_session(env) -> None:  # noqa: F811
    nodes, _, make = env
    service: RolloutService = await make()
    await service.register(report("a"))
    await service.submit(task(n=2))
    await until(lambda: all(v.acknowledged for v in service.session_views("t")))
    sids = [v.session_id for v in service.session_views("t")]

    summary = await service.cancel("t")
    assert summary is not None and summary.status == TaskStatus.RUNNING  # the node reports
    assert sorted(nodes.cancels) == sorted(("a", sid) for sid in sids)
    for sid in sids:  # what the node sends once it stopped the session (partial trajectory)
        await service.accept_result(
            SessionResult(
                session_id=sid,
                task_id="t",
                status=SessionStatus.ERROR,
                error="cancelled",
                failure=CANCELLED,
                node_id="a",
            )
        )
    assert service.summary("t").status == TaskStatus.COMPLETED  # type: ignore[union-attr]
    again = await service.cancel("t")  # idempotent: nothing left to cancel, nothing asked
    assert again == service.summary("t") and len(nodes.cancels) == 2


@pytest.mark.parametrize("answer", [404, httpx.ConnectError("node unreachable")])
async def test_a_node_that_cannot_cancel_leaves_the_ending_to_the_server(
    env,  # noqa: F811
    answer: int | Exception,
) -> None:
    nodes, _, make = env
    service: RolloutService = await make()
    await service.register(report("a"))
    await service.submit(task(n=1))
    await until(lambda: service.session_views("t")[0].acknowledged)
    nodes.cancel_answer = answer
    summary = await service.cancel("t")
    assert summary is not None and summary.status == TaskStatus.COMPLETED
    [view] = service.session_views("t")
    assert view.node_id == "a" and failure_of(service, view.session_id) == CANCELLED


async def test_node_results_keep_the_failure_invariant(env) -> None:  # noqa: F811
    _, _, make = env
    service: RolloutService = await make()
    await service.submit(task(n=3))
    erred, timed_out, completed = (v.session_id for v in service.session_views("t"))
    stray = SessionFailure(kind="agent", reason="stray")
    for sid, status, failure in (
        (erred, SessionStatus.ERROR, None),  # a node older than the field
        (timed_out, SessionStatus.TIMEOUT, None),
        (completed, SessionStatus.COMPLETED, stray),
    ):
        result = SessionResult(session_id=sid, task_id="t", status=status, failure=failure)
        assert await service.accept_result(result)
    assert failure_of(service, erred) == SessionFailure(kind="agent", reason="unspecified")
    assert failure_of(service, timed_out) == SessionFailure(
        kind="timeout", reason="budget_exhausted"
    )
    assert failure_of(service, completed) is None


# -- over HTTP, with the admin token ------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[BackgroundServer, str]]:
    app = create_rollout_app(RolloutServerConfig(data_dir=tmp_path, dispatch_interval_s=0.02))
    with BackgroundServer(app) as s:
        yield s, app.state.service.access.admin_token


def test_resubmitting_an_id_over_http(server: tuple[BackgroundServer, str]) -> None:
    s, admin = server
    headers = {"authorization": f"Bearer {admin}"}
    body = {"task_id": "t", "instruction": "x", "num_samples": 2}
    first = httpx.post(f"{s.url}/tasks", json=body, headers=headers)
    assert first.status_code == 201, first.text
    again = httpx.post(f"{s.url}/tasks", json=body, headers=headers)
    assert again.status_code == 200 and again.json() == first.json()  # the same task
    other = httpx.post(f"{s.url}/tasks", json={**body, "num_samples": 3}, headers=headers)
    assert other.status_code == 409
    assert "'t' already exists (RUNNING) with a different request" in other.json()["detail"]

    assert httpx.delete(f"{s.url}/tasks/t").status_code == 401  # admin only
    assert httpx.delete(f"{s.url}/tasks/nope", headers=headers).status_code == 404
    cancelled = httpx.delete(f"{s.url}/tasks/t", headers=headers)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "COMPLETED"
    assert cancelled.json()["counts"] == {"ERROR": 2}
    again_cancelled = httpx.delete(f"{s.url}/tasks/t", headers=headers)
    assert again_cancelled.status_code == 200 and again_cancelled.json() == cancelled.json()
    results = TaskResult.model_validate_json(httpx.get(f"{s.url}/tasks/t", headers=headers).content)
    assert [r.failure for r in results.results] == [CANCELLED, CANCELLED]

    finished = httpx.post(f"{s.url}/tasks", json=body, headers=headers)
    assert finished.status_code == 200 and finished.json()["status"] == "COMPLETED"
    other = httpx.post(f"{s.url}/tasks", json={**body, "instruction": "y"}, headers=headers)
    assert other.status_code == 409 and "(COMPLETED)" in other.json()["detail"]


def test_the_client_cancels_and_resubmits_safely(server: tuple[BackgroundServer, str]) -> None:
    s, admin = server
    request = TaskRequest(task_id="c", instruction="x", num_samples=1)
    with RolloutClient(s.url, token=admin) as client:
        assert client.submit(request).status == TaskStatus.RUNNING
        assert client.submit(request).status == TaskStatus.RUNNING  # a retry: the same task
        with pytest.raises(RolloutError, match=r"409.*different request"):
            client.submit(request.model_copy(update={"num_samples": 2}))
        assert client.cancel("c").status == TaskStatus.COMPLETED
        assert client.cancel("c").counts == {"ERROR": 1}
        with pytest.raises(RolloutError, match="404"):
            client.cancel("missing")
