"""Auth by default on the gateway (admin and node API, docs) and session lifetime, against real
gateways on loopback: every control route needs the admin token, the model API stays keyed by
session keys, a closed session never comes back (not by id, not by auto_register, not by a
restart of the node it ran on)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.capture.store import CaptureStore
from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine
from polar.errors import ConfigError
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig, NodeConfig
from polar.gateway.server import BackgroundServer
from polar.gateway.services import app_services

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def node_config(root: Path, **options: Any) -> GatewayConfig:
    return GatewayConfig(
        capture_db=root / "captures.db",
        node=NodeConfig(node_id="n", work_dir=root / "sessions"),
        **options,
    )


def gateway(config: GatewayConfig, tokenizer: Any) -> Any:
    engine = ScriptedEngine(ScriptedBackend(Script(), tokenizer=tokenizer))
    return create_app(config, engine=engine, store=CaptureStore(config.capture_db))


def routes() -> list[tuple[str, str]]:
    """Every operation in a node gateway's OpenAPI schema, and the docs themselves."""
    root = Path(tempfile.mkdtemp())
    app = create_app(
        node_config(root, auth=False), engine=ScriptedEngine(ScriptedBackend(Script()))
    )
    app_services(app).store.close()
    paths = app.openapi()["paths"]
    found = [(method.upper(), path) for path, ops in paths.items() for method in ops]
    return [*found, ("GET", "/docs"), ("GET", "/redoc"), ("GET", "/openapi.json")]


ROUTES = [r for r in routes() if r[1] != "/health"]


def test_the_route_list_is_complete() -> None:
    paths = {path for _, path in ROUTES}
    assert {"/polar/sessions", "/polar/pause", "/polar/node/sessions", "/polar/node/drain"} <= paths


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Any:
    root = tmp_path_factory.mktemp("gateway-auth")
    app = gateway(node_config(root), tokenizer)
    with BackgroundServer(app) as server:
        yield server, app_services(app).admin_token


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_control_route_needs_the_admin_token(served: Any, method: str, path: str) -> None:
    server, token = served
    url = server.url + path.replace("{session_id}", "ps-x").replace("{completion_id}", "c")
    for headers in ({}, {"authorization": "Bearer wrong"}, {"x-polar-admin-token": "wrong"}):
        reply = httpx.request(method, url, headers=headers, content=b"{}", timeout=10)
        assert reply.status_code == 401, (method, path, headers, reply.text)
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert token is not None


def test_a_session_key_opens_its_model_api_and_nothing_else(served: Any) -> None:
    server, token = served
    admin = {"authorization": f"Bearer {token}"}
    info = httpx.post(f"{server.url}/polar/sessions", json={}, headers=admin).json()
    key = info["api_key"]
    as_session = {"authorization": f"Bearer {key}"}
    assert httpx.get(f"{server.url}/polar/sessions", headers=as_session).status_code == 401
    assert httpx.get(f"{server.url}/polar/node/status", headers=as_session).status_code == 401
    call = httpx.post(f"{server.url}/s/{key}/v1/chat/completions", json=CHAT, timeout=30)
    assert call.status_code == 200, call.text


def test_the_token_file_is_made_0600_beside_the_capture_db_and_reused(
    tmp_path: Path, tokenizer: Any
) -> None:
    config = GatewayConfig(capture_db=tmp_path / "c.db")
    first = app_services(gateway(config, tokenizer))
    token_file = tmp_path / "gateway.token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert token_file.read_text().strip() == first.admin_token
    first.store.close()
    again = app_services(gateway(config, tokenizer))
    assert again.admin_token == first.admin_token
    again.store.close()


def test_no_auth_is_refused_off_loopback(tmp_path: Path, tokenizer: Any) -> None:
    config = GatewayConfig(host="0.0.0.0", capture_db=tmp_path / "c.db", auth=False)
    with pytest.raises(ConfigError, match="admin_token"):
        gateway(config, tokenizer)


def made_with_a_call(server: BackgroundServer, admin: dict[str, str], sid: str) -> httpx.Response:
    """Session ``sid`` made through the admin API, and its first model call (answered)."""
    made = httpx.post(f"{server.url}/polar/sessions", json={"session_id": sid}, headers=admin)
    assert made.status_code == 201
    call = httpx.post(f"{server.url}/s/{sid}/v1/chat/completions", json=CHAT, timeout=30)
    assert call.status_code == 200
    return call


def test_a_closed_session_is_never_reopened(tmp_path: Path, tokenizer: Any) -> None:
    config = GatewayConfig(capture_db=tmp_path / "c.db", auto_register=True)
    app = gateway(config, tokenizer)
    admin = {"x-polar-admin-token": app_services(app).admin_token or ""}
    with BackgroundServer(app) as server:
        sid = "ps-closing-session-0000000001"
        made_with_a_call(server, admin, sid)
        model = f"{server.url}/s/{sid}/v1/chat/completions"
        gone = httpx.delete(f"{server.url}/polar/sessions/{sid}", headers=admin)
        assert gone.status_code == 204
        # auto_register must not make it again, nor may the admin API
        assert httpx.post(model, json=CHAT, timeout=30).status_code == 401
        again = httpx.post(f"{server.url}/polar/sessions", json={"session_id": sid}, headers=admin)
        assert again.status_code == 409
    app_services(app).store.close()
    # ... nor a restart
    app = gateway(config, tokenizer)
    with BackgroundServer(app) as server:
        assert httpx.post(f"{server.url}/s/{sid}/v1/chat/completions", json=CHAT).status_code == 401


def test_a_restarted_node_closes_the_sessions_of_its_earlier_life(
    tmp_path: Path, tokenizer: Any
) -> None:
    config = node_config(tmp_path)
    store = CaptureStore(config.capture_db)
    sid = "ps-was-running-when-it-died-01"
    asyncio.run(store.add_session(sid, {"task_id": "t"}))  # running when the node died
    store.close()
    app = gateway(config, tokenizer)
    with BackgroundServer(app) as server:
        call = httpx.post(f"{server.url}/s/{sid}/v1/chat/completions", json=CHAT, timeout=30)
        assert call.status_code == 401
        assert sid in app_services(app).store.closed_sessions()


def test_a_closed_sessions_records_stay_readable_by_the_operator(
    tmp_path: Path, tokenizer: Any
) -> None:
    """A node closes each finished session (its key stops working) but keeps its records; the
    capture API serves them to the admin token, and still to nobody else."""
    config = node_config(tmp_path)
    store = CaptureStore(config.capture_db)
    sid = "ps-finished-on-an-earlier-life"
    asyncio.run(store.add_session(sid, {"task_id": "t"}))
    store.close()
    app = gateway(config, tokenizer)
    admin = {"x-polar-admin-token": app_services(app).admin_token or ""}
    with BackgroundServer(app) as server:
        live = "ps-a-live-session-000000000001"
        call = made_with_a_call(server, admin, live)
        asyncio.run(app_services(app).sessions.close(live))  # as the node closes a finished one
        assert (
            httpx.post(f"{server.url}/s/{live}/v1/chat/completions", json=CHAT).status_code == 401
        )
        for closed, calls in [(live, 1), (sid, 0)]:
            base = f"{server.url}/polar/sessions/{closed}"
            records = httpx.get(f"{base}/records", headers=admin)
            assert records.status_code == 200 and len(records.json()) == calls, records.text
            listed = httpx.get(f"{base}/completions", headers=admin)
            assert listed.status_code == 200 and len(listed.json()) == calls
            assert httpx.get(f"{base}/records").status_code == 401
        record_id = call.json()["id"]
        one = httpx.get(f"{server.url}/polar/sessions/{live}/records/{record_id}", headers=admin)
        assert one.status_code == 200 and one.json()["completion_id"] == record_id
        unknown = httpx.get(
            f"{server.url}/polar/sessions/ps-never-was-000000001/records", headers=admin
        )
        assert unknown.status_code == 404
    app_services(app).store.close()
