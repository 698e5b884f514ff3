"""Session affinity through a real external router (issue 31): the gateway's ``router:`` setting
sends each call's routing key in the router's own header, and the real router binary from PyPI
(vllm-router's ``consistent_hash``, sglang-router's ``manual`` policy) sends every call of one
session to one of two scripted engine replicas. Opt-in: skips unless the router's CLI is on
PATH or named by POLAR_VLLM_ROUTER_BIN / POLAR_SGLANG_ROUTER_BIN (.ci/run installs them into a
venv of their own; docs/engines.md has the recipe)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest

from integration.rollout_support.cluster import free_port
from polar.engines.pool import routing_key
from polar.engines.registry import ROUTER_HEADERS, EngineConfig
from polar.engines.scripted import Script, ScriptedBackend, create_scripted_app
from polar.gateway.server import BackgroundServer
from pool_kit import Gateway, assert_exact_single_chain, new_sessions, wait_serving

pytestmark = pytest.mark.slow

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# router name -> (env override, CLI on PATH, argv before the options, its affinity policy)
ROUTERS = {
    "vllm-router": ("POLAR_VLLM_ROUTER_BIN", "vllm-router", [], "consistent_hash"),
    "sglang-router": ("POLAR_SGLANG_ROUTER_BIN", "sglang-router", ["launch"], "manual"),
}
SESSIONS = 11  # odd: round-robin would move a session each round; all on one replica: 2 in 2**11


class KeyRecorder:
    """An ASGI wrapper noting the routing key of every model call that reaches its replica."""

    def __init__(self, app: Any, header: str) -> None:
        self.app, self.header, self.keys = app, header.lower().encode(), list[str]()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"].startswith("/v1/")
            and scope["method"] == "POST"
        ):
            found = dict(scope["headers"]).get(self.header)
            self.keys.append(found.decode() if found else "")
        await self.app(scope, receive, send)


def _router_cli(name: str) -> str:
    env, cli, _, _ = ROUTERS[name]
    found = os.environ.get(env) or shutil.which(cli)
    if not found:
        pytest.skip(f"{name} not installed (pip install {name}; or set {env} to its CLI)")
    return found


@pytest.fixture(params=list(ROUTERS))
def router(
    request: pytest.FixtureRequest, tokenizer: Any, tmp_path: Path
) -> Iterator[tuple[str, str, list[KeyRecorder]]]:
    """(router name, its URL, the two replicas' recorders) with the real router in front."""
    name = str(request.param)
    cli = _router_cli(name)
    _, _, argv, policy = ROUTERS[name]
    replicas = [
        KeyRecorder(create_scripted_app(ScriptedBackend(Script(), tokenizer=tokenizer)), header)
        for header in [ROUTER_HEADERS[name]] * 2
    ]
    servers = [BackgroundServer(r).start() for r in replicas]
    port = free_port()
    log = (tmp_path / "router.log").open("wb")
    command = [cli, *argv, "--host", "127.0.0.1", "--port", str(port), "--policy", policy]
    proc = subprocess.Popen(
        [*command, "--worker-urls", *[s.url for s in servers]], stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_serving(url, proc, "/v1/models", log=tmp_path / "router.log")
        yield name, url, replicas
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
        for server in servers:
            server.stop()


def test_every_call_of_a_session_reaches_one_replica_through_the_real_router(
    tmp_path: Path, router: tuple[str, str, list[KeyRecorder]]
) -> None:
    name, url, replicas = router
    engine = EngineConfig(kind="vllm", router=name, base_url=url)
    render: dict[str, str] = {}
    if name == "sglang-router":
        # Its /v1/completions refuses token-id prompts (422) and its /v1/models answers model
        # "unknown" (no tokenizer to render with): vLLM-shaped replicas get chat completions.
        render = {"mode": "engine"}
    gateway = Gateway(tmp_path / "c.db", [], engine=engine, render=render)
    try:
        sessions = new_sessions(gateway, SESSIONS)
        gateway.rounds(sessions, 3)
        keys = {routing_key(key): key for key in sessions}
        where = [{k for k in r.keys if k} for r in replicas]
        assert all(len(r.keys) == len([k for k in r.keys if k in keys]) for r in replicas), (
            "a call reached a replica without its session's routing key"
        )
        assert sum(len(r.keys) for r in replicas) == 3 * SESSIONS
        assert not where[0] & where[1], "a session's calls were split over the replicas"
        assert where[0] and where[1], "the router sent every session to one replica"
        for key in sessions:
            assert_exact_single_chain(gateway.store, key)
    finally:
        gateway.close()
