"""Polar in one process: a rollout server and one gateway node in front of any engine.

Both servers listen on loopback ports picked at start, because harnesses run as separate
processes (in a sandbox) and reach the gateway over HTTP as they would in production. The
engine is whatever :class:`~polar.engines.base.Engine` the caller hands in: the embedded one
(in process, no socket) or a client of a vLLM/SGLang server. ``polar quickstart`` and the
embedded trainer (``polar train``) both run on it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from polar.capture.store import CaptureStore
from polar.delivery import RetryPolicy
from polar.engines.base import Engine
from polar.engines.registry import EngineConfig
from polar.gateway.app import create_app as create_gateway_app
from polar.gateway.config import GatewayConfig, NodeConfig
from polar.gateway.listen import bind_gateway
from polar.gateway.server import BackgroundServer
from polar.gateway.services import app_services
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig
from polar.rollout.dashboard import sign_in_url
from polar.schemas.sampling import SamplingPolicy

if TYPE_CHECKING:
    from polar.engines.embedded import EmbeddedEngineCore

NODE_ID = "local"


class LocalStack:
    """Start with :meth:`start`, stop with :meth:`stop` (or use it as a context manager).

    ``work_dir`` receives the rollout state (``rollout/``, its admin token in
    ``rollout/rollout.token``), the capture store (``captures.db``, the gateway's admin token
    beside it in ``gateway.token``) and one directory per session (``sessions/<id>``). With
    ``admin_token`` given, both servers use it instead. With the served model's ``tokenizer``,
    the rollout server's dashboard shows token text. ``ready_buffer`` is
    the node's (default: one prepared runtime per run slot; 0 starts a session's runtime, and
    so its time budget, only when a run slot is free). ``postrun_workers`` build and evaluate
    finished sessions at once (raise it when evaluations run tests). ``loop`` is uvicorn's
    event loop for both servers: ``"asyncio"`` when several stacks in one process start
    harnesses (uvloop refuses to spawn processes from two loops at once).
    """

    def __init__(
        self,
        engine: Engine,
        work_dir: str | Path,
        *,
        engine_config: EngineConfig,
        served_model: str | None = None,
        context_window: int | None = None,
        policy_version: int = 0,
        sampling: SamplingPolicy | None = None,
        runtime: str | None = None,
        run_workers: int = 4,
        init_workers: int = 2,
        postrun_workers: int = 2,
        ready_buffer: int | None = None,
        admin_token: str | None = None,
        tokenizer: Any = None,
        loop: str = "auto",
    ) -> None:
        self.engine = engine
        self.work_dir = Path(work_dir)
        self.engine_config = engine_config
        self.served_model = served_model
        self.context_window = context_window
        self.policy_version = policy_version
        self.sampling = sampling or SamplingPolicy()
        self.runtime = runtime
        self.run_workers = run_workers
        self.init_workers = init_workers
        self.postrun_workers = postrun_workers
        self.ready_buffer = run_workers if ready_buffer is None else ready_buffer
        self.admin_token = admin_token
        self.tokenizer = tokenizer
        self.loop = loop
        self.rollout: BackgroundServer | None = None
        self.gateway: BackgroundServer | None = None
        self.gateway_app: Any = None
        self.rollout_app: Any = None

    @classmethod
    def embedded(cls, core: EmbeddedEngineCore, work_dir: str | Path, **options: Any) -> LocalStack:
        """A stack serving ``core``'s model in process: a trainer that updates that model
        inside ``core.weights_update()`` changes what the next rollout samples, with no weight
        sync at all."""
        from polar.engines.embedded.client import EmbeddedEngine  # torch: only when asked for

        options.setdefault("tokenizer", core.tokenizer)
        return cls(
            EmbeddedEngine(core),
            work_dir,
            engine_config=EngineConfig(kind="embedded"),
            served_model=core.model_name,
            context_window=core.max_model_len,
            policy_version=core.policy_version,
            **options,
        )

    @property
    def rollout_token(self) -> str | None:
        """The rollout server's admin token (what clients of the stack send)."""
        assert self.rollout_app is not None, "stack not started"
        token: str | None = self.rollout_app.state.service.access.admin_token
        return token

    @property
    def gateway_token(self) -> str | None:
        """The gateway's admin token (pause, resume, policy, its capture API)."""
        assert self.gateway_app is not None, "stack not started"
        return app_services(self.gateway_app).admin_token

    @property
    def rollout_url(self) -> str:
        assert self.rollout is not None, "stack not started"
        return self.rollout.url

    @property
    def dashboard_url(self) -> str:
        """The rollout server's dashboard, as a sign-in link (its read-only viewer token)."""
        return sign_in_url(self.rollout_url, self.rollout_token)

    @property
    def gateway_url(self) -> str:
        assert self.gateway is not None, "stack not started"
        return self.gateway.url

    @property
    def sampling_policy(self) -> SamplingPolicy:
        """The live policy the gateway applies to every call (change it between rollouts)."""
        assert self.gateway_app is not None, "stack not started"
        return app_services(self.gateway_app).config.sampling

    @property
    def capture_db(self) -> Path:
        return self.work_dir / "captures.db"

    @property
    def store(self) -> CaptureStore:
        """The gateway's capture store (read it while the stack runs)."""
        assert self.gateway_app is not None, "stack not started"
        return app_services(self.gateway_app).store

    def start(self) -> LocalStack:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_rollout()
            self._start_gateway()
            self._wait_for_node()
        except BaseException:
            self.stop()
            raise
        return self

    def stop_gateway(self) -> None:
        """Stop the gateway node: unfinished sessions are cancelled, their runtimes killed, and
        their results still delivered to the rollout server, which keeps running."""
        if self.gateway is not None:
            self.gateway.stop()
            self.gateway = None

    def stop(self) -> None:
        self.stop_gateway()
        if self.rollout is not None:
            self.rollout.stop()
            self.rollout = None

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start_rollout(self) -> None:
        config = RolloutServerConfig(
            port=0,
            data_dir=self.work_dir / "rollout",
            admin_token=self.admin_token,
            dispatch_interval_s=0.02,
            dispatch_retry=RetryPolicy(initial_s=0.05, max_s=1.0, timeout_s=30.0),
            callback_retry=RetryPolicy(initial_s=0.1, max_s=1.0, deadline_s=60.0),
            default_runtime=self.runtime,
            # The node lives in this process: silence means the process is starved (a loaded
            # machine, a long update holding the GIL), not a dead node. With the 30 s default
            # a run on 2 busy cores lost 8 live sessions that way.
            heartbeat_timeout_s=60.0,
            node_grace_s=900.0,
        )
        self.rollout_app = create_rollout_app(config, tokenizer=self.tokenizer)
        self.rollout = BackgroundServer(self.rollout_app, loop=self.loop).start()

    def _start_gateway(self) -> None:
        assert self.rollout is not None
        config = GatewayConfig(
            port=0,
            engine=self.engine_config,
            served_model=self.served_model,
            sampling=self.sampling,
            context_window=self.context_window,
            capture_db=self.capture_db,
            admin_token=self.admin_token,
            policy_version=self.policy_version,
            node=NodeConfig(
                node_id=NODE_ID,
                init_workers=self.init_workers,
                run_workers=self.run_workers,
                postrun_workers=self.postrun_workers,
                ready_buffer=self.ready_buffer,
                work_dir=self.work_dir / "sessions",
                rollout_url=self.rollout.url,
                rollout_token=self.rollout_token,
                heartbeat_s=0.5,
            ),
        )
        # The node registers its own URL, so the port is bound before the app is built.
        config, sock = bind_gateway(config)
        self.gateway_app = create_gateway_app(
            config, engine=self.engine, store=CaptureStore(self.capture_db)
        )
        self.gateway = BackgroundServer(
            self.gateway_app, loop=self.loop, sock=sock, limits=config.server_limits()
        ).start()

    def _wait_for_node(self, timeout_s: float = 30.0) -> None:
        token = self.rollout_token
        headers = {"authorization": f"Bearer {token}"} if token else {}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            nodes = httpx.get(f"{self.rollout_url}/nodes", headers=headers, timeout=5).json()
            if any(n["healthy"] for n in nodes):
                return
            time.sleep(0.05)
        raise RuntimeError("the gateway node did not register with the rollout server")
