"""The dashboard without a browser: who may see it (the viewer token, its cookie, GET only),
what its pages say about nodes, tasks and sessions, and that they load nothing from elsewhere."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.auth import cookie
from polar.gateway.server import BackgroundServer
from polar.rollout.access import viewer_token
from polar.rollout.activity import Activity
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig
from polar.rollout.dashboard import sign_in_url
from polar.rollout.dashboard.outcomes import Outcomes
from polar.rollout.dashboard.views import node_card, reward_histogram
from polar.schemas.node import NodeReport, NodeStatus, StageCounts, Workers
from polar.schemas.rollout import NodeView
from polar.schemas.task import SessionResult, SessionStatus
from polar.schemas.trajectory import Trace, Trajectory, TrajectoryStatus

HOSTILE = "<script>alert('x')</script>"


class Server:
    def __init__(self, server: BackgroundServer, app: Any) -> None:
        self.service = app.state.service
        self.access = self.service.access
        self.url = server.url

    @property
    def admin(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.access.admin_token}"}

    def viewer(self) -> httpx.Client:
        """A browser's view: the cookie /dashboard/login sets."""
        reply = httpx.get(f"{self.url}/dashboard/login", params={"token": self.access.admin_token})
        assert reply.status_code == 303 and reply.headers["location"] == "/dashboard"
        return httpx.Client(base_url=self.url, cookies=reply.cookies)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    config = RolloutServerConfig(data_dir=tmp_path / "data", dispatch_interval_s=0.02)
    app = create_rollout_app(config)
    with BackgroundServer(app) as s:
        yield Server(s, app)


def register(s: Server, node_id: str = "n1") -> None:
    workers = Workers(init=2, run=4, postrun=1, ready_buffer=2, queue_limit=16)
    stages = StageCounts(queued=1, initializing=2, ready=1, running=3)
    status = NodeStatus(node_id=node_id, url="http://127.0.0.1:9", workers=workers, stages=stages)
    reply = httpx.post(
        f"{s.url}/nodes/register",
        content=NodeReport(status=status).model_dump_json(),
        headers={**s.admin, "content-type": "application/json"},
    )
    assert reply.status_code == 200, reply.text


def submit(s: Server, task_id: str, samples: int) -> None:
    task = {
        "task_id": task_id,
        "instruction": "x",
        "num_samples": samples,
        "agent": {"harness": "shell", "settings": {"command": "true"}},
    }
    assert httpx.post(f"{s.url}/tasks", json=task, headers=s.admin).status_code == 201


def test_the_viewer_token_opens_the_dashboard_and_events_only(server: Server) -> None:
    view = viewer_token(server.access.admin_token)
    assert view != server.access.admin_token
    as_viewer = {"authorization": f"Bearer {view}"}
    for path in ("/dashboard", "/dashboard/live", "/dashboard/static/dashboard.js"):
        assert httpx.get(server.url + path, headers=as_viewer).status_code == 200, path
    with httpx.stream("GET", f"{server.url}/events", headers=as_viewer, timeout=5) as stream:
        assert stream.status_code == 200
    for method, path in (("GET", "/tasks"), ("GET", "/status"), ("GET", "/nodes"),
                         ("POST", "/tasks"), ("POST", "/nodes/n1/drain")):  # fmt: skip
        reply = httpx.request(method, server.url + path, headers=as_viewer, content=b"{}")
        assert reply.status_code == 401, (method, path)


def test_no_token_no_dashboard(server: Server) -> None:
    for path in ("/dashboard", "/dashboard/live", "/dashboard/tasks/t", "/dashboard/sessions/s"):
        assert httpx.get(server.url + path).status_code == 401, path
    wrong = httpx.get(f"{server.url}/dashboard/login", params={"token": "wrong"})
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    assert "does not open" in wrong.text
    form = httpx.get(f"{server.url}/dashboard/login")
    assert form.status_code == 200 and "<form method='post'" in form.text
    assert httpx.get(f"{server.url}/dashboard/static/dashboard.css").status_code == 200


def test_the_login_leaves_only_the_viewer_token_in_an_httponly_cookie(server: Server) -> None:
    reply = httpx.post(
        f"{server.url}/dashboard/login",
        content=f"token={server.access.admin_token}",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert reply.status_code == 303
    set_cookie = reply.headers["set-cookie"]
    assert "HttpOnly" in set_cookie and "SameSite=strict" in set_cookie
    assert server.access.admin_token not in set_cookie
    assert server.access.viewer_token in set_cookie
    assert server.access.viewer_cookie is not None
    header = [(b"cookie", set_cookie.split(";")[0].encode())]
    assert cookie(header, server.access.viewer_cookie) == server.access.viewer_token


def test_a_cookie_opens_nothing_but_get(server: Server) -> None:
    """Even the admin token, if a cookie carried it, would not admit a POST: no request a
    browser sends by itself can change anything."""
    name = server.access.viewer_cookie
    jar = {name: server.access.admin_token}
    task = {"task_id": "t", "instruction": "x", "agent": {"harness": "shell"}}
    assert httpx.post(f"{server.url}/tasks", json=task, cookies=jar).status_code == 401
    assert httpx.get(f"{server.url}/dashboard", cookies=jar).status_code == 200


def test_sign_in_url_carries_the_viewer_token(server: Server) -> None:
    url = sign_in_url(server.url + "/", server.access.admin_token)
    assert url == f"{server.url}/dashboard/login?token={server.access.viewer_token}"
    assert sign_in_url(server.url, None) == f"{server.url}/dashboard/login"


def test_the_overview_shows_nodes_tasks_and_failures(server: Server) -> None:
    register(server)
    submit(server, "t1", 4)
    with server.viewer() as browser:
        page = browser.get("/dashboard")
        assert page.status_code == 200
        assert "default-src 'none'" in page.headers["content-security-policy"]
        text = page.text
        assert "data-node='n1'" in text and "<span class='badge healthy'>healthy</span>" in text
        assert "<span class='num'>3/4</span>" in text  # RUN: 3 running of 4 workers
        assert "<span class='num'>2/2</span> <span class='note'>+1 waiting</span>" in text
        assert "data-task='t1' data-finished='0' data-samples='4' data-status='RUNNING'" in text
        # Nothing but this server's own two files.
        assert set(re.findall(r" (?:src|href)='([^']*)'", text)) == {
            "/dashboard",
            "/dashboard/tasks/t1",
            "/dashboard/static/dashboard.css",
            "/dashboard/static/dashboard.js",
        }
        assert "<style" not in text and "<script>" not in text  # no inline script or style


def test_a_task_page_lists_sessions_and_a_session_page_its_trajectory(server: Server) -> None:
    service = server.service
    submit(server, "t2", 3)
    sessions = httpx.get(f"{server.url}/tasks/t2/sessions", headers=server.admin).json()
    trace = Trace(
        prompt_ids=[7, 8],
        response_ids=[2, 3, 1, 4],
        loss_mask=[1, 1, 0, 1],
        response_logprobs=[-0.1, -0.2, 0.0, -4.0],
        prompt_messages=[{"role": "user", "content": "make hello.txt"}],
        response_messages=[
            {"role": "assistant", "tool_calls": [
                {"function": {"name": "run", "arguments": '{"command": "touch hello.txt"}'}}]},
            {"role": "tool", "content": HOSTILE},
            {"role": "assistant", "content": "Done."},
        ],
        finish_reason="stop",
    )  # fmt: skip
    results = [
        SessionResult(
            session_id=sessions[0]["session_id"],
            task_id="t2",
            status=SessionStatus.COMPLETED,
            reward=1.0,
            trajectory=Trajectory(status=TrajectoryStatus.COMPLETED, traces=[trace]),
            timing={"total": 2.5},
            metadata={"sample_index": 0},
        ),
        SessionResult(
            session_id=sessions[1]["session_id"],
            task_id="t2",
            status=SessionStatus.ERROR,
            error=f"run failed: {HOSTILE}\nmore detail",
        ),
    ]
    for result in results:
        service.store.finish(result)
        service.activity.record(result)
    with server.viewer() as browser:
        task = browser.get("/dashboard/tasks/t2").text
        assert "data-finished='2' data-samples='3'" in task
        assert "100%<div class='note'>1/1 reward &gt; 0</div>" in task  # the error has none
        assert "<b>1×</b> run failed: &lt;script&gt;" in task  # the reason, escaped, first line
        assert task.count("class='session-link'") == 2  # the finished ones open
        live = browser.get("/dashboard/tasks/t2/live").text
        assert live.lstrip().startswith("<section class='panel'>") and "<html" not in live

        page = browser.get(f"/dashboard/sessions/{sessions[0]['session_id']}").text
        assert "turn 1 · sampled · 2 tokens" in page and "between turns · 1 tokens" in page
        assert "⟨2⟩" in page  # no tokenizer on this server: ids
        assert "→ run({&#34;command&#34;: &#34;touch hello.txt&#34;})" in page
        assert HOSTILE not in page and "&lt;script&gt;" in page
        waiting = browser.get(f"/dashboard/sessions/{sessions[2]['session_id']}").text
        assert "its trajectory shows here once it finishes" in waiting
        assert browser.get("/dashboard/sessions/ps-unknown").status_code == 404
        overview = browser.get("/dashboard").text
        assert "sessions completed / timeout / error" in overview
        assert "2 since the server started" in overview

    # A final result's headline is read out of the store once, however often pages refresh.
    reads: list[list[str]] = []
    headlines = service.store.headlines
    service.store.headlines = lambda ids: reads.append(ids) or headlines(ids)
    fresh = Outcomes(service.store)
    assert [o.reward for o in fresh.of_task("t2")] == [1.0, None, None]
    assert fresh.of_task("t2")[1].error == f"run failed: {HOSTILE}\nmore detail"
    assert len(reads) == 1 and len(reads[0]) == 2


def test_node_cards_say_how_each_node_is() -> None:
    def view(**fields: object) -> NodeView:
        base = {"node_id": "n", "url": None, "healthy": True, "draining": False, "dead": False,
                "seen_s_ago": 0.1, "capacity": 3, "stages": {}, "workers": {"run": 4}}  # fmt: skip
        return NodeView.model_validate(base | fields)

    assert node_card(view(), None).state == "healthy"
    assert node_card(view(healthy=False), None).state == "silent"
    assert node_card(view(draining=True), None).state == "draining"
    assert node_card(view(dead=True, draining=True), None).state == "dead"
    run = node_card(view(stages={"running": 6}), None).pools[2]
    assert (run.name, run.busy, run.size, run.share) == ("RUN", 6, 4, 100.0)


def test_reward_histograms() -> None:
    assert reward_histogram([]) == []
    two = reward_histogram([0.0, 1.0, 1.0, 1.0])
    assert [(b.label, b.count, b.height) for b in two] == [("0", 1, 100 / 3), ("1", 3, 100.0)]
    spread = reward_histogram([i / 10 for i in range(11)])
    assert len(spread) == 8 and sum(b.count for b in spread) == 11


def test_activity_counts_sessions_calls_and_sampled_tokens() -> None:
    now = [1000.0]
    activity = Activity(clock=lambda: now[0], window_s=600)
    trace = Trace(prompt_ids=[1], response_ids=[2, 3, 4], loss_mask=[1, 0, 1])
    trajectory = Trajectory(
        status=TrajectoryStatus.COMPLETED, traces=[trace, trace], metadata={"num_calls": 3}
    )
    now[0] += 30
    for index in range(3):
        activity.record(
            SessionResult(
                session_id=f"ps-{index}",
                task_id="t",
                status=SessionStatus.COMPLETED,
                node_id="a",
                trajectory=trajectory,
                timing={"total": 4.0},
            )
        )
    rates = activity.rates(60)
    assert rates.span_s == 30  # the server is 30 s old
    assert rates.sessions_per_min == 6 and rates.calls_per_s == 9 / 30
    assert rates.tokens_per_s == 12 / 30  # two trainable tokens per trace, two traces
    assert activity.by_node()["a"].finished == 3 and activity.by_node()["a"].mean_seconds == 4
    assert sum(activity.histogram()) == 3
    now[0] += 700
    assert activity.rates(60).sessions_per_min == 0 and activity.total == 3
    activity.record(SessionResult(session_id="ps-9", task_id="t", status=SessionStatus.ERROR))
    assert sum(activity.histogram()) == 1  # older ones left the window


def test_tasks_and_the_overview_show_the_delivered_fraction_and_its_reasons(
    server: Server,
) -> None:
    from polar.schemas.task import SessionFailure

    service = server.service
    submit(server, "t3", 3)
    sessions = httpx.get(f"{server.url}/tasks/t3/sessions", headers=server.admin).json()
    counted = {"sampled_tokens": 100, "delivered_tokens": 90, "lost": {"stale": 10}}
    built = Trajectory(status=TrajectoryStatus.COMPLETED, metadata={"delivery": counted})
    outcomes = [
        (SessionStatus.COMPLETED, None),
        (SessionStatus.ERROR, SessionFailure(kind="evaluator", reason="evaluator_failed")),
    ]
    for (status, failure), session in zip(outcomes, sessions, strict=False):
        result = SessionResult(
            session_id=session["session_id"],
            task_id="t3",
            status=status,
            trajectory=built,
            failure=failure,
            reward=1.0 if failure is None else None,
        )
        service.store.finish(result)
        service.metrics.tokens_delivered(result.delivery)
    with server.viewer() as browser:
        task = browser.get("/dashboard/tasks/t3").text
        assert ">45.0%</span>" in task  # 90 of 200
        assert "lost: evaluator failure 90, stale 20</div>" in task
        overview = browser.get("/dashboard").text
        assert "<b>45.0%</b><span>sampled tokens delivered (lost: evaluator failure 90" in overview
