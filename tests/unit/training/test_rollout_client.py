"""The trainer's rollout client: polling to completion, timeouts, dropped connections."""

from __future__ import annotations

import httpx
import pytest

from polar.schemas.task import TaskRequest
from polar.training import rollout_client
from polar.training.rollout_client import RolloutClient, RolloutTimeout


def task_body(status: str) -> dict[str, object]:
    return {"task_id": "t", "status": status, "results": [], "result_paths": []}


def client(handler: object, monkeypatch: pytest.MonkeyPatch) -> RolloutClient:
    monkeypatch.setattr(rollout_client, "RETRY_DELAY_S", 0.0)
    return RolloutClient("http://r", poll_s=0.0, transport=httpx.MockTransport(handler))  # type: ignore[arg-type]


def test_run_submits_polls_and_survives_a_dropped_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if request.method == "POST":
            return httpx.Response(201, json={})
        if len(seen) == 2:  # the server closed a keep-alive connection as we reused it
            raise httpx.RemoteProtocolError("Server disconnected", request=request)
        return httpx.Response(200, json=task_body("RUNNING" if len(seen) < 4 else "COMPLETED"))

    [result] = client(handler, monkeypatch).run([TaskRequest(task_id="t", instruction="x")], 5)
    assert result.status == "COMPLETED"
    assert seen == ["POST /tasks"] + ["GET /tasks/t"] * 3


def test_a_submit_whose_answer_was_lost_is_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts = []

    def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(request.method)
        if len(attempts) == 1:
            raise httpx.ReadError("lost", request=request)
        return httpx.Response(409, json={"detail": "task t is still running"})

    client(handler, monkeypatch).submit(TaskRequest(task_id="t", instruction="x"))
    assert attempts == ["POST", "POST"]


def test_wait_times_out_with_the_unfinished_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=task_body("RUNNING"))

    with pytest.raises(RolloutTimeout, match="1 task"):
        client(handler, monkeypatch).wait(["t"], timeout_s=0.0)


def test_progress_hears_finished_sessions_as_they_grow(monkeypatch: pytest.MonkeyPatch) -> None:
    session = {"session_id": "s", "task_id": "t", "status": "COMPLETED"}
    polls = iter([("RUNNING", 0), ("RUNNING", 1), ("RUNNING", 1), ("COMPLETED", 2)])

    def handler(request: httpx.Request) -> httpx.Response:
        status, finished = next(polls)
        body = task_body(status)
        body["results"] = [session] * finished
        return httpx.Response(200, json=body)

    heard: list[int] = []
    client(handler, monkeypatch).wait(["t"], timeout_s=5, progress=heard.append)
    assert heard == [1, 2]
