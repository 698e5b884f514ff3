"""The two actors Polar puts on a Ray cluster. Each wraps the server Polar runs anyway (the
rollout app, the gateway app): no second code path. Ray places, supervises and restarts them;
everything they say to each other, to engines and to trainers goes over HTTP.

These are plain classes; :mod:`polar.ray.launcher` and :mod:`polar.ray.provider` make actors of
them with ``ray.remote(...)``, so importing this module does not import Ray.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from polar import tokens
from polar.ray.config import PolarRayConfig, RayGateways
from polar.stack.servers import (
    GatewayConfig,
    NodeConfig,
    bind_socket,
    serve_gateway,
    serve_rollout,
)
from polar.stack.topology import WorkerCounts


class GatewaySpec(BaseModel):
    """What a gateway actor needs: the gateways section and its rollout server."""

    model_config = ConfigDict(extra="forbid")

    gateways: RayGateways
    rollout_url: str
    enrolment_secret: str | None


def gateway_node_id(ray_node_id: str) -> str:
    """A gateway's Polar node id: stable across restarts on the same Ray node."""
    return f"ray-{ray_node_id[:12]}"


def auto_workers(cpus: int) -> WorkerCounts:
    """Worker counts for a node with ``cpus`` cores (harnesses run outside Ray's accounting,
    so the node's cores, not Ray's CPU resource, bound them)."""
    cpus = max(1, cpus)
    return WorkerCounts(
        init=max(1, cpus // 4),
        run=cpus,
        postrun=max(1, cpus // 4),
        ready_buffer=max(1, cpus // 2),
        queue_limit=max(16, cpus * 8),
    )


def _node_ip() -> str:
    import ray

    return str(ray.util.get_node_ip_address())


class GatewayActor:
    """One gateway node (``polar serve-gateway`` with a session lifecycle) on this Ray node."""

    def __init__(self, spec_json: str) -> None:
        import ray

        spec = GatewaySpec.model_validate_json(spec_json)
        context = ray.get_runtime_context()
        self.ray_node_id = context.get_node_id()
        self.restarted = bool(context.was_current_actor_reconstructed)
        self.node_id = gateway_node_id(self.ray_node_id)
        section = spec.gateways
        host = section.host or _node_ip()
        # Per node, not per incarnation: a restart finds its capture store and refuses (409)
        # session ids it ran in an earlier life.
        root = Path(section.work_dir) / self.node_id
        workers = (
            auto_workers(len(os.sched_getaffinity(0)))
            if section.workers == "auto"
            else section.workers
        )
        config = GatewayConfig(
            host=host,
            port=0,
            engine=section.engine,
            served_model=section.served_model,
            sampling=section.sampling,
            context_window=section.context_window,
            capture_db=root / "captures.db",
            node=NodeConfig(
                node_id=self.node_id,
                **workers.node_options(),
                work_dir=root / "sessions",
                rollout_url=spec.rollout_url,
                rollout_token=spec.enrolment_secret,
                heartbeat_s=section.heartbeat_s,
            ),
        )
        self.url, self.server = serve_gateway(config)

    def where(self) -> dict[str, Any]:
        """Where this gateway runs (the tests and ``polar ray status`` read it)."""
        return {
            "node_id": self.node_id,
            "ray_node_id": self.ray_node_id,
            "url": self.url,
            "pid": os.getpid(),
            "restarted": self.restarted,
        }


class RolloutActor:
    """The rollout server, with the Ray node provider keeping its gateways."""

    def __init__(self, config_json: str) -> None:
        import ray

        from polar.ray.provider import RayNodeProvider

        deployment = PolarRayConfig.model_validate_json(config_json)
        section = deployment.ray
        self.ray_node_id = ray.get_runtime_context().get_node_id()
        self.restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        host = section.rollout.host or _node_ip()
        config = deployment.rollout_config().model_copy(update={"host": host})
        # Made (or read back, after a restart) before the app: the gateways enrol with it.
        admin = tokens.admin_token(
            host=host,
            auth=config.auth,
            configured=config.admin_token,
            token_file=config.token_file(),
            what="rollout server",
            how="the server then makes an admin token (or set rollout.admin_token).",
        )
        sock = bind_socket(host, config.port)
        port = int(sock.getsockname()[1])
        self.url = (config.public_url or f"http://{host}:{port}").rstrip("/")
        config = config.model_copy(
            update={"port": port, "public_url": self.url, "admin_token": admin}
        )
        self.admin_token = admin
        self.provider = RayNodeProvider(
            section,
            GatewaySpec(
                gateways=section.gateways,
                rollout_url=self.url,
                enrolment_secret=config.enrolment_secret or admin,
            ),
            state_dir=config.data_dir,
        )
        self.server = serve_rollout(config, sock, provider=self.provider)

    def where(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "ray_node_id": self.ray_node_id,
            "pid": os.getpid(),
            "restarted": self.restarted,
        }

    def token(self) -> str | None:
        """The admin token, for the driver that started Polar (it talks to the server over
        HTTP with it); anyone who may call actors on this cluster may run code here anyway."""
        return self.admin_token

    def retire(self, node_id: str, deadline_s: float | None) -> bool:
        """Do not keep a gateway on ``node_id``'s Ray node any more (it is draining)."""
        return self.provider.retire(node_id, deadline_s)
