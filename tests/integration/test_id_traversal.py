"""Ids that are not of the id grammar are refused on every route that takes one (issue 14.4):
the rollout server, the gateway's admin API, its node API and its model API. A dispatched
``session_id`` with ``../`` once made a directory outside the node's work_dir."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig, NodeConfig
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig
from polar.rollout.service import RolloutService
from polar.schemas.ids import InvalidId, is_valid_id, new_session_id, path_segment

TOKEN = "test-admin-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
BAD_IDS = ["../x", "a/b", "..", "", "x" * 300, "../../escaped", ".hidden", "a b", "a\nb"]
GOOD_SESSION = "ps-" + "a" * 32
WORKERS = {"init": 1, "run": 1, "postrun": 1, "ready_buffer": 0, "queue_limit": 4}


def in_path(value: str) -> str:
    """``value`` as one URL path segment, dots encoded too so no client folds ``..`` away."""
    return quote(value, safe="").replace(".", "%2E")


def refused(reply: httpx.Response, value: str) -> bool:
    """A route that takes an id answers 422; an id with a slash (or none) matches no route."""
    if "/" in value or "\n" in value or not value:
        return reply.status_code in (307, 404, 405, 422)
    return reply.status_code == 422


@pytest.fixture
def root(tmp_path: Path) -> Path:
    # Deep enough that "../../escaped" from any data directory stays inside tmp_path.
    return tmp_path / "a" / "b"


@pytest.fixture
async def rollout(root: Path) -> AsyncIterator[httpx.AsyncClient]:
    config = RolloutServerConfig(data_dir=root / "rollout", admin_token=TOKEN)
    offline = httpx.AsyncClient(transport=httpx.MockTransport(lambda _: httpx.Response(503)))
    app = create_rollout_app(config, service=RolloutService(config, client=offline))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://r", headers=AUTH) as c:
        yield c


@pytest.fixture
async def gateway(root: Path, tokenizer: Any) -> AsyncIterator[httpx.AsyncClient]:
    config = GatewayConfig(
        capture_db=root / "gateway" / "captures.db",
        admin_token=TOKEN,
        auto_register=True,
        node=NodeConfig(node_id="n", work_dir=root / "gateway" / "sessions"),
    )
    engine = ScriptedEngine(ScriptedBackend(Script(), tokenizer=tokenizer))
    app = create_app(config, engine=engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://g", headers=AUTH) as c:
        yield c


def everything_under(path: Path) -> set[Path]:
    return set(path.rglob("*")) if path.exists() else set()


def nothing_escaped(tmp_path: Path, root: Path) -> None:
    outside = {p for p in everything_under(tmp_path) if root not in (p, *p.parents)}
    assert outside <= {tmp_path / "a"}, f"created outside the data directories: {outside}"


def rollout_requests(bad: str) -> list[tuple[str, str, Any]]:
    task = {"task_id": "t", "instruction": "x"}
    status = {"node_id": "n", "url": "http://127.0.0.1:9", "workers": WORKERS}
    result = {"session_id": GOOD_SESSION, "task_id": "t", "status": "COMPLETED", "node_id": "n"}
    seg = in_path(bad)
    return [
        ("POST", "/tasks", {**task, "task_id": bad}),
        ("GET", f"/tasks/{seg}", None),
        ("GET", f"/tasks/{seg}/summary", None),
        ("GET", f"/tasks/{seg}/sessions", None),
        ("GET", f"/events?task_id={quote(bad, safe='')}", None),
        ("POST", "/nodes/register", {"status": {**status, "node_id": bad}}),
        ("POST", "/nodes/register", {"status": status, "sessions": {bad: "RUNNING"}}),
        ("POST", f"/nodes/{seg}/heartbeat", {"status": {**status, "node_id": bad}}),
        ("POST", f"/nodes/{seg}/drain", None),
        ("POST", "/results", {**result, "session_id": bad}),
        ("POST", "/results", {**result, "task_id": bad}),
        ("POST", "/results", {**result, "node_id": bad}),
    ]


def gateway_requests(bad: str) -> list[tuple[str, str, Any]]:
    seg = in_path(bad)
    dispatch = {"session_id": GOOD_SESSION, "task": {"task_id": "t", "instruction": "x"}}
    return [
        ("POST", "/polar/sessions", {"session_id": bad}),
        ("GET", f"/polar/sessions/{seg}", None),
        ("GET", f"/polar/sessions/{seg}/completions", None),
        ("GET", f"/polar/sessions/{seg}/records", None),
        ("GET", f"/polar/sessions/{seg}/records/chatcmpl-1", None),
        ("DELETE", f"/polar/sessions/{seg}", None),
        ("POST", "/polar/node/sessions", {**dispatch, "session_id": bad}),
        (
            "POST",
            "/polar/node/sessions",
            {**dispatch, "task": {**dispatch["task"], "task_id": bad}},
        ),
        ("GET", f"/polar/node/sessions/{seg}", None),
        ("DELETE", f"/polar/node/sessions/{seg}", None),
    ]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
async def test_the_rollout_server_refuses_bad_ids_everywhere(
    rollout: httpx.AsyncClient, bad: str, tmp_path: Path, root: Path
) -> None:
    for method, url, body in rollout_requests(bad):
        reply = await rollout.request(method, url, json=body)
        assert refused(reply, bad), (method, url, body, reply.status_code, reply.text)
    assert (await rollout.get("/tasks")).json() == []
    assert (await rollout.get("/nodes")).json() == []
    nothing_escaped(tmp_path, root)


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
async def test_the_gateway_refuses_bad_ids_everywhere(
    gateway: httpx.AsyncClient, bad: str, tmp_path: Path, root: Path
) -> None:
    for method, url, body in gateway_requests(bad):
        reply = await gateway.request(method, url, json=body)
        assert refused(reply, bad), (method, url, body, reply.status_code, reply.text)
    assert (await gateway.get("/polar/sessions")).json() == []
    assert (await gateway.get("/polar/node/sessions")).json() == []
    nothing_escaped(tmp_path, root)


@pytest.mark.parametrize("bad", [b for b in BAD_IDS if b and "\n" not in b], ids=repr)
async def test_the_model_api_answers_a_bad_key_as_an_unknown_one(
    gateway: httpx.AsyncClient, bad: str
) -> None:
    """Even with auto_register on, a key that is no id is an unknown key: 401 in the caller's
    provider shape, and no session is made of it."""
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    anthropic = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    for url, headers, body in [
        ("/v1/chat/completions", {"authorization": f"Bearer {bad}"}, chat),
        ("/v1/messages", {"x-api-key": bad, "authorization": ""}, anthropic),
    ] + ([] if "/" in bad else [(f"/s/{in_path(bad)}/v1/chat/completions", {}, chat)]):
        reply = await gateway.post(url, json=body, headers=headers)
        assert reply.status_code == 401, (url, reply.status_code, reply.text)
        error = reply.json()
        if url == "/v1/messages":
            assert error["type"] == "error" and error["error"]["type"] == "authentication_error"
        else:
            assert error["error"]["message"] == "unknown session key"
    assert (await gateway.get("/polar/sessions", headers=AUTH)).json() == []


def test_path_segment_takes_only_the_grammar() -> None:
    for good in ["t", "node-0", "hello-file", new_session_id(), "x" * 128, "A_9-b"]:
        assert is_valid_id(good) and path_segment(good) == good
    for bad in [*BAD_IDS, "x" * 129, "-x", "_x", "a.b", "a\\b", "a:b", "é", None, 7]:
        assert not is_valid_id(bad)
        with pytest.raises(InvalidId):
            path_segment(bad)
