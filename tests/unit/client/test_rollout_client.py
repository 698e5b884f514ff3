"""The one typed rollout client, against a real rollout server on loopback: submit, follow the
event stream to completion, progress, timeouts, a lost submit answer, a dropped stream."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.client import AsyncRolloutClient, RolloutClient, RolloutError, RolloutTimeout
from polar.delivery import RetryPolicy
from polar.gateway.server import BackgroundServer
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig
from polar.schemas.node import NodeReport, NodeStatus, Workers
from polar.schemas.rollout import EventKind
from polar.schemas.task import SessionResult, SessionStatus, TaskRequest, TaskStatus

TOKEN = "tok"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[BackgroundServer]:
    config = RolloutServerConfig(data_dir=tmp_path / "data", admin_token=TOKEN)
    with BackgroundServer(create_rollout_app(config)) as s:
        yield s


def finish(url: str, task_id: str, *, reward: float = 1.0, delay_s: float = 0.0) -> None:
    """Play a node: enrol, wait until the task's sessions are bound to it (their dispatch to
    its closed port is retried meanwhile), post a final result for each."""
    admin = {"authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, timeout=10) as http:
        status = NodeStatus(
            node_id="fake",
            url="http://127.0.0.1:9",
            workers=Workers(init=1, run=8, postrun=1, ready_buffer=1, queue_limit=64),
        )
        body = NodeReport(status=status).model_dump_json()
        enrolled = http.post(
            "/nodes/register",
            content=body,
            headers={**admin, "content-type": "application/json"},
        )
        headers = {"authorization": f"Bearer {enrolled.json()['credential']}"}
        deadline = time.monotonic() + 10
        while True:
            views = http.get(f"/tasks/{task_id}/sessions", headers=admin).json()
            if all(v["node_id"] == "fake" for v in views) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        for view in views:
            time.sleep(delay_s)
            result = SessionResult(
                session_id=view["session_id"],
                task_id=task_id,
                status=SessionStatus.COMPLETED,
                reward=reward,
            )
            answer = http.post(
                "/results",
                content=result.model_dump_json(),
                headers={**headers, "content-type": "application/json"},
            )
            assert answer.status_code == 200, answer.text


def task(task_id: str, n: int = 3) -> TaskRequest:
    return TaskRequest(task_id=task_id, instruction="x", num_samples=n)


def test_wait_follows_events_to_the_results_with_progress(server: BackgroundServer) -> None:
    heard: list[int] = []
    with RolloutClient(server.url, token=TOKEN) as client:
        summary = client.submit(task("a"))
        assert summary.status is TaskStatus.RUNNING and summary.num_samples == 3
        node = threading.Thread(target=finish, args=(server.url, "a"), kwargs={"delay_s": 0.3})
        node.start()
        done = client.wait(["a"], timeout_s=20, progress=heard.append)
        node.join()
    result = done["a"]
    assert result.status is TaskStatus.COMPLETED
    assert [r.reward for r in result.results] == [1.0, 1.0, 1.0]
    assert heard and heard == sorted(set(heard)) and heard[-1] == 3


def test_a_task_finished_before_waiting_is_seen_at_once(server: BackgroundServer) -> None:
    with RolloutClient(server.url, token=TOKEN) as client:
        client.submit(task("early", n=2))
        finish(server.url, "early")
        started = time.monotonic()
        done = client.wait(["early"], timeout_s=20)
    assert time.monotonic() - started < 5
    assert len(done["early"].results) == 2


def test_wait_times_out_naming_the_unfinished_tasks(server: BackgroundServer) -> None:
    with RolloutClient(server.url, token=TOKEN) as client:
        client.submit(task("slow", n=1))
        with pytest.raises(RolloutTimeout, match=r"1 task.*slow"):
            client.wait(["slow"], timeout_s=0.5)


def test_closing_with_a_wait_still_running_leaves_no_pending_task(tmp_path: Path) -> None:
    """``start_wait`` (or a call Ctrl-C interrupted) still running at ``close()``: the process
    exits without asyncio's "Task was destroyed but it is pending!" and the wait is cancelled."""
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from polar.client import RolloutClient
        from polar.gateway.server import BackgroundServer
        from polar.rollout.app import create_rollout_app
        from polar.rollout.config import RolloutServerConfig
        from polar.schemas.task import TaskRequest

        config = RolloutServerConfig(data_dir=Path({str(tmp_path)!r}), admin_token="t")
        with BackgroundServer(create_rollout_app(config)) as server:
            client = RolloutClient(server.url, token="t")
            client.submit(TaskRequest(task_id="a", instruction="x", num_samples=1))
            waiting = client.start_wait(["a"], timeout_s=60)
            time.sleep(0.5)  # the wait follows the event stream now
            client.close()
            print("cancelled" if waiting.cancelled() else "not cancelled")
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "cancelled"
    assert "Task was destroyed" not in run.stderr, run.stderr


class StallOnce:
    """ASGI wrapper: the first summary read blocks the server's event loop for ``stall_s``, as
    an in-process server on loaded cores was seen to (silent for over 30 s mid-run)."""

    def __init__(self, app: Any, stall_s: float) -> None:
        self.app = app
        self.stall_s = stall_s
        self.stalled = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/summary") and not self.stalled:
            self.stalled = True
            time.sleep(self.stall_s)  # blocks the loop: every request waits, none is answered
        await self.app(scope, receive, send)


def test_a_wait_rides_out_a_server_silent_for_longer_than_a_read_may_take(
    tmp_path: Path,
) -> None:
    """A plain read gives up at the client's deadline; a wait, which has a deadline of its own,
    keeps trying (up to WAIT_RETRY's) instead of ending an hour-long run on one silent spell."""
    config = RolloutServerConfig(data_dir=tmp_path / "data", admin_token=TOKEN)
    impatient = RetryPolicy(initial_s=0.05, max_s=0.1, deadline_s=0.5)
    stall = StallOnce(create_rollout_app(config), stall_s=2.0)
    with (
        BackgroundServer(stall) as server,
        RolloutClient(server.url, token=TOKEN, timeout_s=0.3, retry=impatient) as client,
    ):
        client.submit(task("busy", n=2))
        node = threading.Thread(target=finish, args=(server.url, "busy"))
        node.start()
        done = client.wait(["busy"], timeout_s=30)
        node.join()
        assert stall.stalled
        assert [r.reward for r in done["busy"].results] == [1.0, 1.0]
        stall.stalled = False  # the same silence on a plain read is an error, soon
        with pytest.raises(RolloutError, match="cannot reach"):
            client.summary("busy")


def test_views_are_typed_and_a_wrong_token_is_a_clear_error(server: BackgroundServer) -> None:
    with RolloutClient(server.url, token=TOKEN) as client:
        client.submit(task("v", n=2))
        sessions = client.sessions("v")
        assert [s.status for s in sessions] == [SessionStatus.REGISTERED] * 2
        assert client.status().sessions == {"REGISTERED": 2}
        assert client.nodes() == []
    with (
        RolloutClient(server.url, token="wrong") as bad,
        pytest.raises(RolloutError, match="HTTP 401"),
    ):
        bad.summary("v")


def test_a_submit_whose_answer_was_lost_is_not_an_error() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(f"{request.method} {request.url.path}")
        if len(calls) == 1:
            raise httpx.ReadError("answer lost", request=request)
        summary = {
            "task_id": "t",
            "status": "RUNNING",
            "num_samples": 1,
            "counts": {},
            "created_at": 0.0,
            "finished_at": None,
        }
        return httpx.Response(200, json=summary)  # the same request again: the existing task

    fast = RetryPolicy(initial_s=0.001, max_s=0.001, deadline_s=5)
    with RolloutClient("http://r", retry=fast, transport=httpx.MockTransport(handler)) as client:
        summary = client.submit(TaskRequest(task_id="t", instruction="x"))
    assert summary.task_id == "t"
    assert calls == ["POST /tasks", "POST /tasks"]


def test_a_409_is_a_conflict() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        detail = "task 't' already exists (RUNNING) with a different request"
        return httpx.Response(409, json={"detail": detail})

    with (
        RolloutClient("http://r", transport=httpx.MockTransport(handler)) as client,
        pytest.raises(RolloutError, match=r"409.*different request"),
    ):
        client.submit(TaskRequest(task_id="t", instruction="x"))


def sse(*events: tuple[int, str]) -> bytes:
    return b"".join(
        f'id: {i}\nevent: {kind}\ndata: {{"task_id": "t"}}\n\n'.encode() for i, kind in events
    )


async def test_a_dropped_event_stream_resumes_after_the_last_event() -> None:
    last_ids: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        last_ids.append(request.headers.get("last-event-id"))
        if len(last_ids) == 1:  # the connection ends after two events
            body = (
                b": connected\n\n"
                + sse((1, "task_submitted"))
                + b": keepalive\n\n"  # a comment is not an event
                + sse((2, "session_dispatched"))
            )
        else:
            body = sse((3, "session_finished"))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    seen = []
    async with AsyncRolloutClient("http://r", transport=httpx.MockTransport(handler)) as client:
        async for event in client.events("t"):
            seen.append((event.id, event.kind))
            if len(seen) == 3:
                break
    assert seen == [
        (1, EventKind.TASK_SUBMITTED),
        (2, EventKind.SESSION_DISPATCHED),
        (3, EventKind.SESSION_FINISHED),
    ]
    assert last_ids == ["0", "2"]
