"""A stopped server's thread ends, its app's shutdown included, even with a model call still
in flight. Before, uvicorn waited for that call (a scripted engine thinking for 60 s) before
the app's shutdown, ``BackgroundServer.stop`` gave up after its timeout and returned, and the
thread lived on past its stack: after a ``tests/integration/test_generate.py`` run, a node's
heartbeat kept printing "rollout server ... ConnectError; retrying" after pytest ended."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from polar.capture.store import CaptureStore
from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine, ScriptedReply
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.server import BackgroundServer

TOKEN = "test-admin-token"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def polar_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "polar-server" and t.is_alive()}


def test_a_server_stopped_with_a_call_in_flight_ends_with_its_app(
    tmp_path: Path, tokenizer: Any
) -> None:
    before = polar_threads()
    script = Script([ScriptedReply(content="Thinking...", delay_s=60.0)])
    engine = ScriptedEngine(ScriptedBackend(script, tokenizer=tokenizer))
    config = GatewayConfig(capture_db=tmp_path / "c.db", admin_token=TOKEN)
    app = create_app(config, engine=engine, store=CaptureStore(config.capture_db))
    server = BackgroundServer(app, grace_s=1.0).start()
    reply = httpx.post(
        f"{server.url}/polar/sessions", json={}, headers={"authorization": f"Bearer {TOKEN}"}
    )
    key = reply.json()["session_id"]

    def slow_call() -> None:
        with contextlib.suppress(httpx.HTTPError):  # cut by the stop: what this test wants
            httpx.post(f"{server.url}/s/{key}/v1/chat/completions", json=CHAT, timeout=90)

    caller = threading.Thread(target=slow_call, daemon=True)
    caller.start()
    time.sleep(1.0)  # the call is in the engine now
    started = time.monotonic()
    server.stop(timeout_s=20)
    assert not server.running, "the server's thread outlived stop()"
    assert time.monotonic() - started < 15
    assert polar_threads() == before  # no server thread of this test is left
    caller.join(10)
    assert not caller.is_alive()
