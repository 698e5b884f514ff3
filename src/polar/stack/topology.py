"""The topology YAML: one file describes the rollout server, its gateway nodes and their engines.

It sits above both servers: ``polar serve-rollout`` takes its ``rollout:`` section,
``polar serve-gateway --node ID`` the gateway config of one of its ``nodes:``. Every model here
forbids unknown keys, so a typo (``run_worker:``) is a clear error naming the key and where it
sits, never a silently ignored setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from polar.config_loader import load_config, parse_config
from polar.engines.registry import EngineConfig
from polar.errors import ConfigError
from polar.gateway.config import GatewayConfig, NodeConfig
from polar.rollout.config import RolloutServerConfig
from polar.schemas.ids import NodeId
from polar.schemas.sampling import SamplingPolicy


class WorkerCounts(BaseModel):
    """Per-stage worker counts of one gateway node."""

    model_config = ConfigDict(extra="forbid")

    init: int = Field(2, ge=1)
    run: int = Field(4, ge=1)
    postrun: int = Field(2, ge=1)
    ready_buffer: int = Field(4, ge=0, description="0 runs INIT inline on the run slot.")
    queue_limit: int = Field(256, ge=1, description="Sessions a node accepts before 429.")

    def node_options(self) -> dict[str, int]:
        """These counts as :class:`NodeConfig` keyword arguments."""
        return {
            "init_workers": self.init,
            "run_workers": self.run,
            "postrun_workers": self.postrun,
            "ready_buffer": self.ready_buffer,
            "queue_limit": self.queue_limit,
        }


class NodeSpec(BaseModel):
    """One gateway node: where it listens, its engine, its worker counts."""

    model_config = ConfigDict(extra="forbid")

    id: NodeId
    host: str = "127.0.0.1"
    port: int = Field(8100, ge=0, le=65535)
    public_url: str | None = None
    engine: EngineConfig = Field(default_factory=EngineConfig)
    served_model: str | None = None
    sampling: SamplingPolicy = Field(default_factory=SamplingPolicy)
    context_window: int | None = Field(None, gt=0)
    workers: WorkerCounts = Field(default_factory=WorkerCounts)
    capture_db: Path | None = Field(None, description="Default: <work_dir>/captures.db.")
    work_dir: Path | None = Field(None, description="Default: polar-node-<id>.")
    admin_token: str | None = None

    def base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")


class TopologyDefaults(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runtime: str | None = Field(
        None, description="Runtime kind for tasks that do not name one (e.g. bubblewrap)."
    )


class Topology(BaseModel):
    """The whole deployment: ``rollout``, ``nodes`` and ``defaults``."""

    model_config = ConfigDict(extra="forbid")

    rollout: RolloutServerConfig = Field(default_factory=RolloutServerConfig)
    nodes: list[NodeSpec] = Field(default_factory=list)
    defaults: TopologyDefaults = Field(default_factory=TopologyDefaults)

    @model_validator(mode="after")
    def _unique_node_ids(self) -> Topology:
        ids = [n.id for n in self.nodes]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"duplicate node id(s): {', '.join(duplicates)}")
        return self

    def node(self, node_id: str) -> NodeSpec:
        for spec in self.nodes:
            if spec.id == node_id:
                return spec
        known = ", ".join(n.id for n in self.nodes) or "none"
        raise ConfigError(f"no node {node_id!r} in the topology (known: {known})")

    def gateway_config(self, node_id: str) -> GatewayConfig:
        """The gateway config ``polar serve-gateway`` runs for node ``node_id``."""
        spec = self.node(node_id)
        work_dir = spec.work_dir or Path(f"polar-node-{spec.id}")
        return GatewayConfig(
            host=spec.host,
            port=spec.port,
            public_url=spec.public_url,
            engine=spec.engine,
            served_model=spec.served_model,
            sampling=spec.sampling,
            context_window=spec.context_window,
            capture_db=spec.capture_db or work_dir / "captures.db",
            admin_token=spec.admin_token,
            node=NodeConfig(
                node_id=spec.id,
                **spec.workers.node_options(),
                work_dir=work_dir,
                rollout_url=self.rollout.base_url(),
                # The enrolment secret: configured, else the token file of a rollout server
                # started from this topology on this machine.
                rollout_token=self.rollout.enrolment_secret or self.rollout.admin_token,
                rollout_token_file=self.rollout.token_file(),
            ),
        )

    def rollout_config(self) -> RolloutServerConfig:
        """The rollout server's config with the topology's defaults and node tokens folded in."""
        return self.rollout.model_copy(
            update={
                "default_runtime": self.defaults.runtime or self.rollout.default_runtime,
                "node_tokens": {
                    **self.rollout.node_tokens,
                    **{n.id: n.admin_token for n in self.nodes if n.admin_token},
                },
            }
        )

    @classmethod
    def from_yaml(cls, path: str | Path) -> Topology:
        return load_config(cls, path, what="topology")

    @classmethod
    def parse(cls, data: Any, *, source: str = "topology") -> Topology:
        return parse_config(cls, data, what=source)
