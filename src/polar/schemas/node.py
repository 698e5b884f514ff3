"""Wire models between the rollout server and its gateway nodes (both sides import these)."""

from __future__ import annotations

import ipaddress
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from polar.schemas.ids import NodeId, SessionId, TaskId
from polar.schemas.task import SessionStatus, TaskRequest

IDEMPOTENCY_HEADER = "idempotency-key"
SESSION_HEADER = "x-polar-session-id"

_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
_HOST = r"([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?\.)*[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
# A URL the rollout server can call: http(s), an ASCII host name or address, a port in range.
NODE_URL = rf"^https?://({_HOST}|\[[0-9A-Fa-f:.]+\])(:{_PORT})?(/[!-~]*)?$"


class StageCounts(BaseModel):
    """How many of a node's unfinished sessions sit in each stage."""

    model_config = ConfigDict(extra="forbid")

    queued: int = Field(0, ge=0, description="Accepted, waiting for an INIT worker.")
    initializing: int = Field(0, ge=0)
    ready: int = Field(0, ge=0, description="Prepared, waiting for a run slot.")
    running: int = Field(0, ge=0)
    postrun_queued: int = Field(0, ge=0)
    postrun: int = Field(0, ge=0)

    @property
    def before_run_done(self) -> int:
        """Sessions that still need (or hold) a run slot."""
        return self.queued + self.initializing + self.ready + self.running

    @property
    def unfinished(self) -> int:
        return self.before_run_done + self.postrun_queued + self.postrun


class Workers(BaseModel):
    model_config = ConfigDict(extra="forbid")

    init: int = Field(ge=1)
    run: int = Field(ge=1)
    postrun: int = Field(ge=1)
    ready_buffer: int = Field(ge=0)
    queue_limit: int = Field(ge=1)


class NodeStatus(BaseModel):
    """A node's self-report: sent on register and every heartbeat, served at /polar/node/status."""

    model_config = ConfigDict(extra="forbid")

    node_id: NodeId
    url: str = Field(pattern=NODE_URL, description="Where the rollout server dispatches sessions.")
    draining: bool = False
    paused: bool = False
    policy_version: int = 0
    workers: Workers
    stages: StageCounts = Field(default_factory=StageCounts)
    finished: int = Field(0, ge=0, description="Sessions finished since the node started.")

    @field_validator("url")
    @classmethod
    def _bracketed_host_is_ipv6(cls, url: str) -> str:
        """The pattern lets any hex in brackets through; an HTTP client would refuse ``[2FD]``
        at the first dispatch, so it is refused at register instead."""
        bracketed = re.match(r"^https?://\[([^\]]*)\]", url)
        if bracketed is not None:
            try:
                ipaddress.IPv6Address(bracketed.group(1))
            except ValueError:
                raise ValueError(f"{bracketed.group(1)!r} is not an IPv6 address") from None
        return url

    @property
    def capacity(self) -> int:
        """Sessions the node still accepts before answering 429."""
        return max(0, self.workers.queue_limit - self.stages.unfinished)


class NodeReport(BaseModel):
    """Register and heartbeat body: the node's status and the sessions it holds."""

    model_config = ConfigDict(extra="forbid")

    status: NodeStatus
    sessions: dict[SessionId, SessionStatus] = Field(
        default_factory=dict,
        description="Unfinished sessions, and finished ones whose result is not yet delivered.",
        json_schema_extra={"additionalProperties": False},  # every key is a SessionId
    )


class SessionDispatch(BaseModel):
    """One session sent to a node; the node starts it at most once per ``session_id``."""

    model_config = ConfigDict(extra="forbid")

    session_id: SessionId = Field(min_length=16, description="Unguessable; the harness's API key.")
    sample_index: int = Field(0, ge=0, le=2**31)
    task: TaskRequest


class NodeSessionInfo(BaseModel):
    """A node's view of one session (the dispatch acknowledgement and GET answer)."""

    model_config = ConfigDict(extra="forbid")

    session_id: SessionId
    task_id: TaskId
    node_id: NodeId
    status: SessionStatus
    stage_started_at: float
    timing: dict[str, float] = Field(default_factory=dict)
    cancelled: bool = False
    error: str | None = None


class Registered(BaseModel):
    """The rollout server's answer to a register or heartbeat."""

    model_config = ConfigDict(extra="forbid")

    node_id: NodeId
    heartbeat_s: float = Field(description="How often the server expects a heartbeat.")
    credential: str | None = Field(
        None,
        description="This node's own credential (on a register answer): it goes on every later "
        "call to the server, the server calls the node with it, and registering this node id "
        "again needs it.",
    )
    retired: list[str] = Field(
        default_factory=list,
        description="Sessions the node reported that the server has finished without it (it "
        "was declared dead, or they are not this node's): the node closes them.",
    )
