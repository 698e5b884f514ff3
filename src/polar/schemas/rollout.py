"""What the rollout server answers about tasks, sessions and nodes (its clients read these)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel

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
    dead: bool
    seen_s_ago: float
    capacity: int
    stages: dict[str, int]


class ResultAck(BaseModel):
    """The rollout server's answer to a node's result delivery."""

    session_id: str
    accepted: bool
    duplicate: bool
