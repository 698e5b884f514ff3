"""What the rollout server answers about tasks, sessions and nodes (its clients read these)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from polar.schemas.task import SessionStatus, TaskStatus


class CallbackState(StrEnum):
    """Delivery of one session's result to the task's ``callback_url``."""

    NONE = "none"
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class TaskSummary(BaseModel):
    task_id: str
    status: TaskStatus
    num_samples: int
    counts: dict[str, int]
    created_at: float
    finished_at: float | None

    @property
    def finished_sessions(self) -> int:
        return sum(n for status, n in self.counts.items() if SessionStatus(status).finished)


class SessionView(BaseModel):
    session_id: str
    task_id: str
    sample_index: int
    status: SessionStatus
    node_id: str | None
    acknowledged: bool
    callback: CallbackState
    reward: float | None = None
    error: str | None = None


class NodeView(BaseModel):
    node_id: str
    url: str | None
    healthy: bool
    draining: bool
    dead: bool = Field(description="Lost: silent past node_grace_s, or reported lost.")
    drained: bool = Field(
        False, description="Drained and then stopped (owing nothing): gone, but not lost."
    )
    seen_s_ago: float
    capacity: int
    stages: dict[str, int]
    workers: dict[str, int] = Field(
        default_factory=dict, description="The node's pool sizes (init, run, postrun, ...)."
    )
    paused: bool = False
    policy_version: int = 0


class ResultAck(BaseModel):
    """The rollout server's answer to a node's result delivery."""

    session_id: str
    accepted: bool
    duplicate: bool


class NodeLoss(BaseModel):
    """``POST /nodes/{id}/lost``: who saw the node go, and how (goes into each session's error)."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(
        "reported lost by an operator",
        max_length=500,
        description="What observed the loss, e.g. 'Ray reports the node dead'.",
    )


class NodeLost(BaseModel):
    """The answer to ``POST /nodes/{id}/lost``."""

    node_id: str
    failed_sessions: int = Field(description="Unfinished sessions failed now (kind infra).")


class TaskCounts(BaseModel):
    """How many tasks the rollout server holds, and how many of them still run."""

    running: int
    total: int


class ServerStatus(BaseModel):
    """``GET /status`` (``RolloutService.status()``): nodes, task and session counts, and what
    is in flight."""

    nodes: list[NodeView]
    tasks: TaskCounts
    sessions: dict[str, int] = Field(description="Sessions per status, all tasks.")
    dispatching: int
    callbacks_in_flight: int
    event_subscribers: int


class EventKind(StrEnum):
    """What ``GET /events`` reports, in order of a session's life."""

    TASK_SUBMITTED = "task_submitted"
    SESSION_DISPATCHED = "session_dispatched"
    SESSION_FINISHED = "session_finished"
    TASK_COMPLETED = "task_completed"
    CALLBACK = "callback"
    NODE_REGISTERED = "node_registered"
    NODE_DRAINING = "node_draining"
    NODE_DEAD = "node_dead"


class RolloutEvent(BaseModel):
    """One Server-Sent Event of ``GET /events``: numbered, so a client resumes after a drop."""

    id: int
    kind: EventKind
    data: dict[str, Any] = Field(default_factory=dict)

    @property
    def task_id(self) -> str | None:
        task_id = self.data.get("task_id")
        return task_id if isinstance(task_id, str) else None
