"""A gateway over several engine replicas, served on loopback, and what tests check on it."""

from __future__ import annotations

import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from polar.capture.store import CaptureStore
from polar.engines.registry import EngineConfig
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.server import BackgroundServer
from polar.gateway.services import app_services
from polar.trajectory.prefix_merging import PrefixMergingBuilder

MODEL = "SmolLM2-135M-Instruct"
# vLLM kills its engine when one model step takes 300 s; on 2 shared cores a step can be
# starved that long by the other servers' threads, and then simply finishes late.
STARVED_STEP_TIMEOUT = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800"}


class Gateway:
    """A gateway app with a pool over the given replica URLs (or ``engine``, such as an external
    router, and ``render`` settings over the defaults), served on loopback."""

    def __init__(
        self,
        db: Path,
        urls: list[str],
        engine: EngineConfig | None = None,
        render: dict[str, Any] | None = None,
    ) -> None:
        self.config = GatewayConfig(
            capture_db=db,
            served_model=MODEL,
            render={"mode": "gateway", "tool_parser": "qwen3", **(render or {})},
            engine=engine or EngineConfig(kind="vllm", replicas=list(urls), health_interval_s=0.2),
        )
        self.store = CaptureStore(db)
        self.app = create_app(self.config, store=self.store)
        self._stack = ExitStack()
        self.server = self._stack.enter_context(BackgroundServer(self.app))
        self.admin = {"x-polar-admin-token": app_services(self.app).admin_token or ""}

    def new_session(self) -> str:
        reply = httpx.post(f"{self.server.url}/polar/sessions", json={}, headers=self.admin)
        reply.raise_for_status()
        return str(reply.json()["api_key"])

    def turn(
        self,
        key: str,
        messages: list[dict[str, Any]],
        max_tokens: int = 16,
        timeout_s: float = 120,
    ) -> None:
        """One chat call; the reply joins the history, then the next user turn."""
        reply = httpx.post(
            f"{self.server.url}/s/{key}/v1/chat/completions",
            json={"model": "m", "messages": messages, "max_tokens": max_tokens},
            timeout=timeout_s,
        )
        assert reply.status_code == 200, reply.text
        messages.append(reply.json()["choices"][0]["message"])
        messages.append({"role": "user", "content": f"and then {len(messages)}?"})

    def rounds(self, sessions: dict[str, list[dict[str, Any]]], n: int) -> None:
        """``n`` turns of every session, interleaved as concurrent agents take them."""
        for _ in range(n):
            for key, messages in sessions.items():
                self.turn(key, messages)

    def close(self) -> None:
        self._stack.close()
        self.store.close()


def engines_of(store: CaptureStore, key: str) -> list[str]:
    return [record.engine for record in store.records(key)]


def assert_exact_single_chain(store: CaptureStore, key: str) -> None:
    """Every call of the session merges into one trace whose trainable ids are the sampled ids."""
    records = store.records(key)
    trajectory = PrefixMergingBuilder().build(records)
    assert len(trajectory.traces) == 1
    trace = trajectory.traces[0]
    sampled = [i for r in records for i in r.sampled_ids]
    trained = [i for i, m in zip(trace.response_ids, trace.loss_mask, strict=True) if m]
    assert trained == sampled


def new_sessions(gateway: Gateway, n: int) -> dict[str, list[dict[str, Any]]]:
    return {gateway.new_session(): [{"role": "user", "content": f"task {i}"}] for i in range(n)}


def wait_serving(
    url: str,
    process: subprocess.Popen[bytes],
    path: str = "/health",
    timeout_s: float = 60.0,
    poll_s: float = 0.3,
    log: Path | None = None,
) -> None:
    """Until the server ``process`` started answers ``path`` with 200; fails at once if it exits
    (with the end of its ``log``), or at the deadline."""

    def tail() -> str:
        return log.read_text(errors="replace")[-2000:] if log else ""

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"{url} exited with {process.returncode}: {tail()}"
        try:
            if httpx.get(f"{url}{path}", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(poll_s)
    raise AssertionError(f"{url} did not answer {path} in {timeout_s:.0f} s: {tail()}")
