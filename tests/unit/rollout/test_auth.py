"""Auth by default on the rollout server, and per-node credentials, against a real server on
loopback: every route but /health needs a token, a node enrols with the enrolment secret and then
speaks only for itself, results come only from the node a session was dispatched to."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.errors import ConfigError
from polar.gateway.server import BackgroundServer
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig
from polar.schemas.node import NodeReport, NodeStatus, Workers
from polar.schemas.task import SessionResult, SessionStatus

ENROL = "enrol-secret"
JSON = {"content-type": "application/json"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[BackgroundServer, str]]:
    config = RolloutServerConfig(
        data_dir=tmp_path / "data", enrolment_secret=ENROL, dispatch_interval_s=0.02
    )
    app = create_rollout_app(config)
    with BackgroundServer(app) as s:
        yield s, app.state.service.access.admin_token


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", **JSON}


def report(node_id: str, url: str = "http://127.0.0.1:9") -> str:
    workers = Workers(init=1, run=4, postrun=1, ready_buffer=1, queue_limit=16)
    return NodeReport(
        status=NodeStatus(node_id=node_id, url=url, workers=workers)
    ).model_dump_json()


def routes(tmp: Path) -> list[tuple[str, str]]:
    """Every operation in the app's OpenAPI schema, and the docs themselves."""
    app = create_rollout_app(RolloutServerConfig(data_dir=tmp, auth=False))
    app.state.service.store.close()
    paths = app.openapi()["paths"]
    found = [(method.upper(), path) for path, ops in paths.items() for method in ops]
    return [*found, ("GET", "/docs"), ("GET", "/redoc"), ("GET", "/openapi.json")]


ROUTES = [r for r in routes(Path(tempfile.mkdtemp())) if r[1] != "/health"]


def test_the_route_list_is_complete() -> None:
    assert ("POST", "/results") in ROUTES and ("POST", "/nodes/register") in ROUTES
    assert len(ROUTES) >= 14


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_but_health_needs_the_admin_token(
    server: tuple[BackgroundServer, str], method: str, path: str
) -> None:
    s, _ = server
    url = s.url + path.replace("{task_id}", "t").replace("{node_id}", "n")
    for headers in ({}, bearer("wrong"), bearer(ENROL)):
        if path == "/nodes/register" and headers.get("authorization") == f"Bearer {ENROL}":
            continue
        reply = httpx.request(method, url, headers=headers, content=b"{}", timeout=10)
        assert reply.status_code == 401, (method, path, headers, reply.text)
    assert httpx.get(f"{s.url}/health").status_code == 200


def test_a_30mb_body_without_a_token_is_refused_before_it_is_read(
    server: tuple[BackgroundServer, str],
) -> None:
    s, _ = server
    reply = httpx.post(f"{s.url}/tasks", content=b"x" * (30 * 1024 * 1024), headers=JSON)
    assert reply.status_code == 401


def test_the_token_file_is_made_0600_and_reused(tmp_path: Path) -> None:
    config = RolloutServerConfig(data_dir=tmp_path)
    first = create_rollout_app(config).state.service
    token_file = tmp_path / "rollout.token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert token_file.read_text().strip() == first.access.admin_token
    first.store.close()
    again = create_rollout_app(config).state.service
    assert again.access.admin_token == first.access.admin_token
    again.store.close()


def test_no_auth_is_refused_off_loopback(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="admin token"):
        create_rollout_app(RolloutServerConfig(host="0.0.0.0", data_dir=tmp_path, auth=False))
    # with auth on (the default) a public bind is fine: every route needs the token
    create_rollout_app(
        RolloutServerConfig(host="0.0.0.0", data_dir=tmp_path)
    ).state.service.store.close()


def enrol(url: str, node_id: str, token: str) -> httpx.Response:
    return httpx.post(f"{url}/nodes/register", content=report(node_id), headers=bearer(token))


def test_a_node_without_the_enrolment_secret_receives_nothing(
    server: tuple[BackgroundServer, str],
) -> None:
    s, admin = server
    assert enrol(s.url, "rogue", "guess").status_code == 401
    nodes = httpx.get(f"{s.url}/nodes", headers=bearer(admin)).json()
    assert nodes == []


def test_a_node_speaks_only_for_itself_and_its_own_sessions(
    server: tuple[BackgroundServer, str],
) -> None:
    s, admin = server
    a = enrol(s.url, "a", ENROL).json()["credential"]
    b = enrol(s.url, "b", admin).json()["credential"]  # the admin token enrols too
    assert a and b and a != b
    # the credential opens only node routes, and only for its own node
    assert httpx.get(f"{s.url}/tasks", headers=bearer(a)).status_code == 401
    assert (
        httpx.post(f"{s.url}/nodes/b/heartbeat", content=report("b"), headers=bearer(a)).status_code
        == 403
    )
    assert (
        httpx.post(f"{s.url}/nodes/a/heartbeat", content=report("a"), headers=bearer(a)).status_code
        == 200
    )
    assert httpx.post(f"{s.url}/nodes/b/drain", headers=bearer(a)).status_code == 403
    # re-registering a live node's id needs its credential
    assert enrol(s.url, "a", ENROL).status_code == 403
    assert enrol(s.url, "a", admin).status_code == 403
    assert enrol(s.url, "a", b).status_code == 403
    assert enrol(s.url, "a", a).status_code == 200

    task = {"task_id": "t", "instruction": "x", "num_samples": 4}
    assert httpx.post(f"{s.url}/tasks", json=task, headers=bearer(admin)).status_code == 201
    sessions = wait_bound(s.url, admin, "t")
    mine = {v["node_id"]: v["session_id"] for v in sessions}
    forged = {"b": b, "admin": admin, "enrol": ENROL}
    for who, token in forged.items():
        result = SessionResult(
            session_id=mine["a"], task_id="t", status=SessionStatus.COMPLETED, reward=1.0
        )
        reply = httpx.post(
            f"{s.url}/results", content=result.model_dump_json(), headers=bearer(token)
        )
        assert reply.status_code in (401, 403), (who, reply.text)
    views = httpx.get(f"{s.url}/tasks/t/sessions", headers=bearer(admin)).json()
    assert all(v["reward"] is None and v["status"] != "COMPLETED" for v in views)
    # its own node's result is accepted
    own = SessionResult(
        session_id=mine["a"], task_id="t", status=SessionStatus.COMPLETED, reward=0.5
    )
    reply = httpx.post(f"{s.url}/results", content=own.model_dump_json(), headers=bearer(a))
    assert reply.status_code == 200 and reply.json()["accepted"] is True


def wait_bound(url: str, admin: str, task_id: str) -> list[dict[str, Any]]:
    """The task's sessions once every one is bound to a node (nodes a and b are enrolled)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        views = httpx.get(f"{url}/tasks/{task_id}/sessions", headers=bearer(admin)).json()
        if {v["node_id"] for v in views} == {"a", "b"}:
            return list(views)
        time.sleep(0.02)
    raise AssertionError(f"sessions not bound to both nodes: {views}")


def test_a_callback_url_off_the_allow_list_is_refused(
    server: tuple[BackgroundServer, str],
) -> None:
    s, admin = server
    task = {"task_id": "cb", "instruction": "x", "callback_url": "http://169.254.169.254/x"}
    reply = httpx.post(f"{s.url}/tasks", json=task, headers=bearer(admin))
    assert reply.status_code == 422 and "callback_hosts" in reply.text
    task["callback_url"] = "http://127.0.0.1:9/results"
    assert httpx.post(f"{s.url}/tasks", json=task, headers=bearer(admin)).status_code == 201
