"""The topology YAML: one file describes the rollout server, its gateway nodes and their engines.

Every model here forbids unknown keys, so a typo (``run_worker:``) is a clear error naming the
key and where it sits, never a silently ignored setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from polar.engines.registry import EngineConfig
from polar.errors import ConfigError
from polar.gateway.config import GatewayConfig, NodeConfig, SamplingPolicy


class RetryPolicy(BaseModel):
    """Exponential backoff: ``initial_s``, doubling up to ``max_s``, for ``deadline_s`` in all."""

    model_config = ConfigDict(extra="forbid")

    initial_s: float = Field(0.5, gt=0)
    max_s: float = Field(30.0, gt=0)
    deadline_s: float = Field(3600.0, gt=0, description="Give up after this long.")
    timeout_s: float = Field(10.0, gt=0, description="Per attempt.")

    def delay(self, attempt: int) -> float:
        """The wait before retry number ``attempt`` (0-based)."""
        return float(min(self.max_s, self.initial_s * (2**attempt)))


class RolloutServerConfig(BaseModel):
    """The rollout server itself."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8200, ge=0, le=65535)
    public_url: str | None = Field(None, description="URL nodes use to reach this server.")
    data_dir: Path = Field(Path("polar-rollout"), description="SQLite state and result JSONL.")
    admin_token: str | None = Field(
        None, description="When set, every route but /health needs it (nodes and trainers)."
    )
    heartbeat_timeout_s: float = Field(
        6.0, gt=0, description="A node silent this long gets no new sessions."
    )
    node_grace_s: float = Field(
        30.0, gt=0, description="A node silent this long is dead: its sessions are marked ERROR."
    )
    dispatch_interval_s: float = Field(0.05, gt=0, description="Scheduler tick when idle.")
    dispatch_retry: RetryPolicy = Field(
        default_factory=lambda: RetryPolicy(initial_s=0.2, max_s=5.0, timeout_s=10.0)
    )
    callback_retry: RetryPolicy = Field(default_factory=RetryPolicy)

    def base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")


class WorkerCounts(BaseModel):
    """Per-stage worker counts of one gateway node."""

    model_config = ConfigDict(extra="forbid")

    init: int = Field(2, ge=1)
    run: int = Field(4, ge=1)
    postrun: int = Field(2, ge=1)
    ready_buffer: int = Field(4, ge=0, description="0 runs INIT inline on the run slot.")
    queue_limit: int = Field(256, ge=1, description="Sessions a node accepts before 429.")


class NodeSpec(BaseModel):
    """One gateway node: where it listens, its engine, its worker counts."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
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
                init_workers=spec.workers.init,
                run_workers=spec.workers.run,
                postrun_workers=spec.workers.postrun,
                ready_buffer=spec.workers.ready_buffer,
                queue_limit=spec.workers.queue_limit,
                work_dir=work_dir,
                rollout_url=self.rollout.base_url(),
                rollout_token=self.rollout.admin_token,
            ),
        )

    @classmethod
    def from_yaml(cls, path: str | Path) -> Topology:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read topology {path}: {exc}") from exc
        return cls.parse(data, source=str(path))

    @classmethod
    def parse(cls, data: Any, *, source: str = "topology") -> Topology:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(f"invalid topology {source}:\n{explain(exc)}") from exc


def explain(exc: ValidationError, root: type[BaseModel] = Topology) -> str:
    """One line per problem, with its dotted location, and the allowed keys for unknown ones."""
    lines = []
    for err in exc.errors():
        loc = err["loc"]
        where = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            owner = _model_at(root, loc[:-1])
            allowed = ", ".join(owner.model_fields) if owner else "?"
            lines.append(f"  {where}: unknown key (allowed here: {allowed})")
        else:
            lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class found by following ``loc`` (field names and list indexes) from ``model``."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part) if _is_model(current) else None
        if field is None:
            return None
        current = _inner_model(field.annotation)
    return current if _is_model(current) else None


def _inner_model(annotation: Any) -> Any:
    """The BaseModel inside ``X``, ``X | None`` or ``list[X]``."""
    if _is_model(annotation):
        return annotation
    for arg in get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _is_model(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, BaseModel)
