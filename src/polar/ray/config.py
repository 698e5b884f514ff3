"""The ``ray:`` deployment file: which Ray cluster, where the rollout server and gateways go.

Strict like every Polar config (a typo is an error naming the key). Nothing here imports Ray.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from polar.config_loader import load_config, parse_config
from polar.engines.registry import EngineConfig
from polar.errors import ConfigError
from polar.runtimes.registry import unsandboxed_runtimes
from polar.schemas.sampling import SamplingPolicy
from polar.stack.servers import RolloutServerConfig
from polar.stack.topology import TopologyDefaults, WorkerCounts

ROLLOUT_ACTOR = "polar-rollout"
GATEWAY_ACTOR_PREFIX = "polar-gw-"


class RayRollout(BaseModel):
    """The rollout server's actor: pinned to a node holding ``resources`` (the head)."""

    model_config = ConfigDict(extra="forbid")

    resources: dict[str, float] = Field(
        default_factory=lambda: {"polar_rollout": 1.0},
        description="Custom resources the actor asks for: put them on one node (the head, "
        "where its SQLite state lives) with `ray start --resources`.",
    )
    max_restarts: int = Field(-1, ge=-1, description="Restarts after a crash (-1: always).")
    host: str | None = Field(
        None,
        description="Bind address; default the node's IP as Ray knows it (rollout.host is not "
        "used: the actor's node is only known once it is placed).",
    )


class RayGateways(BaseModel):
    """One gateway actor per alive Ray node carrying ``resources``."""

    model_config = ConfigDict(extra="forbid")

    resources: dict[str, float] = Field(
        default_factory=lambda: {"polar_gateway": 1.0},
        description="A node carrying these gets a gateway (the actor claims them: one per node).",
    )
    host: str | None = Field(
        None, description="Bind address; default the node's IP as Ray knows it."
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)
    served_model: str | None = None
    sampling: SamplingPolicy = Field(default_factory=SamplingPolicy)
    context_window: int | None = Field(None, gt=0)
    workers: WorkerCounts | Literal["auto"] = Field(
        "auto",
        description="auto: from the node's CPU count (harness processes are invisible to Ray).",
    )
    work_dir: Path = Field(
        Path("/tmp/polar-ray"), description="Per node: <work_dir>/<node id>/ (sessions, captures)."
    )
    heartbeat_s: float = Field(1.0, gt=0)
    max_restarts: int = Field(
        3, ge=-1, description="Same-node restarts after a gateway process crash (-1: always)."
    )
    allow_unsandboxed: bool = Field(
        False,
        description="Let tasks use `runtime: local` on Ray nodes. An unsandboxed harness can "
        "reach the raylet and GCS, and Ray has no auth by default: leave this off.",
    )


class RaySection(BaseModel):
    """Which Ray cluster, and how Polar lives on it."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(
        None,
        description="Ray address (`auto`, HOST:PORT, ray://...); default RAY_ADDRESS. Required: "
        "Polar joins a cluster and never starts one unless start_local is true.",
    )
    start_local: bool = Field(
        False, description="No address: start a single-machine Ray cluster (experiments only)."
    )
    namespace: str = Field("polar", min_length=1, description="Polar's actors live here only.")
    detached: bool = Field(
        False,
        description="Actors outlive the driver that started them (until `polar ray down`).",
    )
    rollout: RayRollout = Field(default_factory=RayRollout)
    gateways: RayGateways = Field(default_factory=RayGateways)
    report_node_loss: bool = Field(
        True, description="A node Ray sees die fails its sessions at once (infra)."
    )
    reconcile_s: float = Field(1.0, gt=0, description="How often the node provider looks.")

    def resolved_address(self) -> str | None:
        """The cluster to join: ``address``, else RAY_ADDRESS; None only with start_local."""
        address = self.address or os.environ.get("RAY_ADDRESS") or None
        if address is None and not self.start_local:
            raise ConfigError(
                "no Ray cluster to join: set ray.address (or RAY_ADDRESS, or --address). Polar "
                "never starts a Ray cluster unless ray.start_local is true"
            )
        return address


class PolarRayConfig(BaseModel):
    """A ``polar ray up`` file: ``ray:``, the rollout server's ``rollout:`` and ``defaults:``."""

    model_config = ConfigDict(extra="forbid")

    ray: RaySection = Field(default_factory=RaySection)
    rollout: RolloutServerConfig = Field(default_factory=RolloutServerConfig)
    defaults: TopologyDefaults = Field(default_factory=TopologyDefaults)

    @model_validator(mode="after")
    def _sandboxed(self) -> PolarRayConfig:
        runtime = self.defaults.runtime or self.rollout.default_runtime
        if runtime in unsandboxed_runtimes() and not self.ray.gateways.allow_unsandboxed:
            raise ValueError(refusal(runtime))
        return self

    def rollout_config(self) -> RolloutServerConfig:
        return self.rollout.model_copy(
            update={"default_runtime": self.defaults.runtime or self.rollout.default_runtime}
        )

    @classmethod
    def from_yaml(cls, path: str | Path) -> PolarRayConfig:
        return load_config(cls, path, what="polar ray config")

    @classmethod
    def parse(cls, data: Any, *, source: str = "polar ray config") -> PolarRayConfig:
        return parse_config(cls, data, what=source)


def refusal(runtime: str) -> str:
    return (
        f"runtime {runtime!r} runs harnesses unsandboxed, and on a Ray node they could reach "
        "the raylet and GCS (no auth by default): use bubblewrap, apptainer or docker, or set "
        "ray.gateways.allow_unsandboxed: true"
    )
