"""The rollout server's settings (the ``rollout:`` section of a topology YAML).

Every model here forbids unknown keys, so a typo is a clear error naming the key.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from polar.delivery import RetryPolicy
from polar.serving import ServerLimits
from polar.tokens import ROLLOUT_TOKEN_FILE

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class RolloutServerConfig(BaseModel):
    """The rollout server itself."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8200, ge=0, le=65535)
    public_url: str | None = Field(None, description="URL nodes use to reach this server.")
    data_dir: Path = Field(Path("polar-rollout"), description="SQLite state and result JSONL.")
    limits: ServerLimits = Field(
        default_factory=ServerLimits,
        description="Connections, header/body read time, keep-alive (see docs/configuration.md).",
    )
    admin_token: str | None = Field(
        None,
        description="The token every route but /health needs (trainers, the CLI, operators); "
        "default: made at first start and kept 0600 in <data_dir>/rollout.token. It also "
        "enrols nodes unless enrolment_secret is set.",
    )
    enrolment_secret: str | None = Field(
        None,
        description="A secret that lets a node register (and nothing else); each node then "
        "gets its own credential for its heartbeats, results and drain.",
    )
    auth: bool = Field(
        True,
        description="false: no tokens at all, for experiments on a loopback host only "
        "(refused on any other host).",
    )
    callback_hosts: list[str] = Field(
        default_factory=lambda: list(LOOPBACK_HOSTS),
        description="Hosts a task's callback_url may name (exact host names or addresses); "
        "a task naming any other host is refused at submit. Default: loopback only.",
    )
    heartbeat_timeout_s: float = Field(
        6.0, gt=0, description="A node silent this long gets no new sessions."
    )
    node_grace_s: float = Field(
        30.0, gt=0, description="A node silent this long is dead: its sessions are marked ERROR."
    )
    forget_nodes_s: float = Field(
        3600.0,
        gt=0,
        description="A dead or drained node leaves GET /nodes (and `polar ray status`) this "
        "long after it died: nodes that come and go are not listed for ever.",
    )
    dispatch_interval_s: float = Field(0.05, gt=0, description="Scheduler tick when idle.")
    dispatch_retry: RetryPolicy = Field(
        default_factory=lambda: RetryPolicy(initial_s=0.2, max_s=5.0, timeout_s=10.0)
    )
    callback_retry: RetryPolicy = Field(default_factory=RetryPolicy)
    default_runtime: str | None = Field(
        None, description="Runtime kind for tasks that name none (topology: defaults.runtime)."
    )
    node_tokens: dict[str, str] = Field(
        default_factory=dict,
        description="Per-node admin tokens for calls to nodes (topology: nodes[].admin_token).",
    )

    def token_file(self) -> Path:
        """Where the server keeps the admin token it made (when none is configured)."""
        return self.data_dir / ROLLOUT_TOKEN_FILE

    def base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")
