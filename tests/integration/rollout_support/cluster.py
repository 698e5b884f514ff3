"""A rollout deployment on loopback: rollout server, gateway nodes, one scripted engine,
and a trainer's callback receiver, all real HTTP servers in this process."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from polar.capture.store import CaptureStore
from polar.delivery import RetryPolicy
from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine, ScriptedReply
from polar.engines.types import EngineResult
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig, NodeConfig
from polar.gateway.server import BackgroundServer
from polar.gateway.services import app_services
from polar.providers.types import NormalizedRequest
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig

AGENT = Path(__file__).with_name("agent.py").read_text()
TOOL_CALL = ScriptedReply(tool_calls=[("run", {"command": "echo hello > hello.txt"})])
FINAL = ScriptedReply(content="Created hello.txt.")


class ConversationEngine(ScriptedEngine):
    """Answers by the conversation's state, so concurrent sessions each get the same story:
    a tool call first, then a final text once a tool result is in the prompt. One per node
    (each node serves on its own event loop); they share the tokenizer."""

    def __init__(self, backend: ScriptedBackend, latency_s: float = 0.0) -> None:
        super().__init__(backend)
        self.lock = asyncio.Lock()
        self.latency_s = latency_s
        self.calls = 0

    async def complete(self, request: NormalizedRequest) -> EngineResult:
        async with self._turn(request):
            return await super().complete(request)

    async def complete_tokens(self, prompt_ids: list[int], request: NormalizedRequest) -> Any:
        async with self._turn(request):
            return await super().complete_tokens(prompt_ids, request)

    @contextlib.asynccontextmanager
    async def _turn(self, request: NormalizedRequest) -> AsyncIterator[None]:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        async with self.lock:
            last = request.messages[-1] if request.messages else {}
            self.backend.script.push(FINAL if last.get("role") == "tool" else TOOL_CALL)
            self.calls += 1
            yield


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class CallbackReceiver:
    """The trainer's endpoint: records every POST; may start late (down, then up)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.received: list[dict[str, Any]] = []
        self.server: BackgroundServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/results"

    def start(self) -> None:
        async def results(request: Request) -> Response:
            self.received.append(
                {
                    "key": request.headers.get("idempotency-key"),
                    "session_id": request.headers.get("x-polar-session-id"),
                    "body": await request.json(),
                }
            )
            return Response(status_code=204)

        app = Starlette(routes=[Route("/results", results, methods=["POST"])])
        self.server = BackgroundServer(app, port=self.port).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


@dataclass
class Node:
    node_id: str
    server: BackgroundServer
    app: Any
    store: CaptureStore

    @property
    def url(self) -> str:
        return self.server.url

    def headers(self) -> dict[str, str]:
        """The gateway's admin token (made in its state dir unless the cluster set one)."""
        return {"authorization": f"Bearer {app_services(self.app).admin_token}"}

    def kill(self) -> None:
        """Vanish without a word: no more heartbeats, no results, then the server goes."""
        node = app_services(self.app).node
        node.lifecycle.on_finished = None
        if node.client is not None and node.client._loop is not None:
            node.client._loop.cancel()
        self.server.stop()


@dataclass
class Cluster:
    rollout: BackgroundServer
    service: Any
    nodes: dict[str, Node]
    engines: dict[str, ConversationEngine]
    receiver: CallbackReceiver
    tmp: Path
    admin_token: str | None = None
    stopped: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.rollout.url

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}

    def submit(self, task: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.url}/tasks", json=task, headers=self.headers(), timeout=10)

    def wait_task(self, task_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reply = httpx.get(f"{self.url}/tasks/{task_id}", headers=self.headers(), timeout=10)
            reply.raise_for_status()
            body = reply.json()
            if body["status"] == "COMPLETED":
                return dict(body)
            time.sleep(0.1)
        raise AssertionError(f"task {task_id} did not complete in {timeout_s}s: {body}")

    def wait_nodes(self, count: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            nodes = httpx.get(f"{self.url}/nodes", headers=self.headers(), timeout=5).json()
            if sum(1 for n in nodes if n["healthy"]) >= count:
                return
            time.sleep(0.05)
        raise AssertionError(f"{count} nodes did not register")

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.node_id not in self.stopped:
                node.server.stop()
        self.rollout.stop()
        self.receiver.stop()


def start_cluster(
    tmp: Path,
    tokenizer: Any,
    *,
    node_ids: tuple[str, ...] = ("a", "b"),
    workers: dict[str, int] | None = None,
    heartbeat_timeout_s: float = 2.0,
    node_grace_s: float = 10.0,
    receiver_up: bool = True,
    admin_token: str | None = None,
) -> Cluster:
    config = RolloutServerConfig(
        data_dir=tmp / "rollout",
        port=free_port(),
        heartbeat_timeout_s=heartbeat_timeout_s,
        node_grace_s=node_grace_s,
        admin_token=admin_token,
        dispatch_interval_s=0.02,
        dispatch_retry=RetryPolicy(initial_s=0.05, max_s=0.5, timeout_s=5),
        callback_retry=RetryPolicy(initial_s=0.05, max_s=0.3, deadline_s=60, timeout_s=5),
    )
    rollout_app = create_rollout_app(config)
    rollout = BackgroundServer(rollout_app, port=config.port).start()
    # Without a configured token the server made one; the nodes enrol with it.
    rollout_token = rollout_app.state.service.access.admin_token
    nodes = {}
    engines = {}
    for node_id in node_ids:
        engine = engines[node_id] = ConversationEngine(
            ScriptedBackend(Script(), tokenizer=tokenizer)
        )
        port = free_port()
        db = tmp / f"node-{node_id}" / "captures.db"
        gateway = GatewayConfig(
            port=port,
            capture_db=db,
            served_model="SmolLM2-135M-Instruct",
            admin_token=admin_token,
            node=NodeConfig(
                node_id=node_id,
                work_dir=tmp / f"node-{node_id}" / "sessions",
                rollout_url=rollout.url,
                rollout_token=rollout_token,
                heartbeat_s=0.2,
                **(workers or {"init_workers": 2, "run_workers": 2, "ready_buffer": 2}),
            ),
        )
        store = CaptureStore(db)
        app = create_app(gateway, engine=engine, store=store)
        # Several nodes share this process, each on its own loop (one node per process in
        # production never meets uvloop's limit on that).
        server = BackgroundServer(app, port=port, loop="asyncio")
        nodes[node_id] = Node(node_id, server.start(), app, store)
    receiver = CallbackReceiver()
    if receiver_up:
        receiver.start()
    cluster = Cluster(
        rollout, rollout_app.state.service, nodes, engines, receiver, tmp, admin_token=rollout_token
    )
    cluster.wait_nodes(len(node_ids))
    return cluster


def shell_task(
    task_id: str,
    receiver: CallbackReceiver,
    *,
    num_samples: int = 4,
    timeout_s: float = 30.0,
    agent_env: dict[str, str] | None = None,
    runtime: dict[str, Any] | None = None,
    evaluator: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A TaskRequest body: the scripted agent under the ``shell`` harness in bubblewrap."""
    return {
        "task_id": task_id,
        "instruction": "Create hello.txt containing hello.",
        "num_samples": num_samples,
        "timeout_seconds": timeout_s,
        "runtime": runtime or {"kind": "bubblewrap", "files": {"agent.py": AGENT}},
        "agent": {
            "harness": "shell",
            "settings": {"command": "python3 agent.py {instruction}"},
            "env": agent_env or {},
        },
        "builder": {"strategy": "prefix_merging"},
        "evaluator": evaluator
        or {"strategy": "test_on_output", "config": {"command": "test -f hello.txt"}},
        "callback_url": receiver.url,
        "metadata": {"group_id": task_id, "rollout_step": 3},
    }
