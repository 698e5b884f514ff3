"""Polar in one process: a rollout server and a gateway node in front of an embedded engine.

The gateway calls the engine through an in-process ASGI transport, so the model the engine
serves is the very object the caller holds: a trainer that updates it inside
``core.weights_update()`` changes what the next rollout samples, with no weight sync at all.
Both servers listen on loopback, because harnesses run as separate processes (in a sandbox)
and reach the gateway over HTTP like they would in production.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import httpx

from polar.capture.store import CaptureStore
from polar.engines.embedded import EmbeddedEngineCore, create_app
from polar.engines.registry import EngineConfig
from polar.engines.vllm import VLLMEngine
from polar.gateway.app import create_app as create_gateway_app
from polar.gateway.config import GatewayConfig, NodeConfig, SamplingPolicy
from polar.gateway.server import BackgroundServer
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RetryPolicy, RolloutServerConfig, Topology, TopologyDefaults

NODE_ID = "embedded"


class LocalStack:
    """Start with :meth:`start`, stop with :meth:`stop` (or use it as a context manager)."""

    def __init__(
        self,
        core: EmbeddedEngineCore,
        work_dir: str | Path,
        *,
        sampling: SamplingPolicy | None = None,
        runtime: str | None = None,
        run_workers: int = 4,
        init_workers: int = 2,
        admin_token: str | None = None,
    ) -> None:
        self.core = core
        self.work_dir = Path(work_dir)
        self.sampling = sampling or SamplingPolicy()
        self.runtime = runtime
        self.run_workers = run_workers
        self.init_workers = init_workers
        self.admin_token = admin_token
        self.rollout: BackgroundServer | None = None
        self.gateway: BackgroundServer | None = None
        self.gateway_app: Any = None

    @property
    def rollout_url(self) -> str:
        assert self.rollout is not None, "stack not started"
        return self.rollout.url

    @property
    def gateway_url(self) -> str:
        assert self.gateway is not None, "stack not started"
        return self.gateway.url

    @property
    def sampling_policy(self) -> SamplingPolicy:
        """The live policy the gateway applies to every call (change it between rollouts)."""
        assert self.gateway_app is not None, "stack not started"
        policy: SamplingPolicy = self.gateway_app.state.config.sampling
        return policy

    def start(self) -> LocalStack:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        rollout_config = RolloutServerConfig(
            port=_free_port(),
            data_dir=self.work_dir / "rollout",
            admin_token=self.admin_token,
            dispatch_interval_s=0.02,
            dispatch_retry=RetryPolicy(initial_s=0.05, max_s=1.0, timeout_s=30.0),
            callback_retry=RetryPolicy(initial_s=0.1, max_s=1.0, deadline_s=60.0),
        )
        topology = Topology(rollout=rollout_config, defaults=TopologyDefaults(runtime=self.runtime))
        self.rollout = BackgroundServer(create_rollout_app(topology), port=rollout_config.port)
        self.rollout.start()
        engine = VLLMEngine(
            "http://embedded", transport=httpx.ASGITransport(app=create_app(self.core))
        )
        port = _free_port()
        db = self.work_dir / "captures.db"
        config = GatewayConfig(
            port=port,
            engine=EngineConfig(kind="embedded"),
            served_model=self.core.model_name,
            sampling=self.sampling,
            context_window=self.core.max_model_len,
            capture_db=db,
            admin_token=self.admin_token,
            policy_version=self.core.policy_version,
            node=NodeConfig(
                node_id=NODE_ID,
                init_workers=self.init_workers,
                run_workers=self.run_workers,
                ready_buffer=self.run_workers,
                work_dir=self.work_dir / "sessions",
                rollout_url=self.rollout.url,
                rollout_token=self.admin_token,
                heartbeat_s=0.5,
            ),
        )
        self.gateway_app = create_gateway_app(config, engine=engine, store=CaptureStore(db))
        try:
            self.gateway = BackgroundServer(self.gateway_app, port=port).start()
            self._wait_for_node()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in (self.gateway, self.rollout):
            if server is not None:
                server.stop()
        self.gateway = self.rollout = None

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_for_node(self, timeout_s: float = 30.0) -> None:
        headers = {"authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            nodes = httpx.get(f"{self.rollout_url}/nodes", headers=headers, timeout=5).json()
            if any(n["healthy"] for n in nodes):
                return
            time.sleep(0.05)
        raise RuntimeError("the gateway node did not register with the rollout server")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
