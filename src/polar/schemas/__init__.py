"""The public wire contract (pydantic models); names here are stable."""

from polar.schemas.task import (
    AgentSpec,
    BuilderSpec,
    EvaluatorSpec,
    GitSource,
    ImageSource,
    RuntimeSpec,
    SessionFailure,
    SessionResult,
    SessionStatus,
    StrategySpec,
    TaskRequest,
    TaskResult,
    WorkspaceSource,
)
from polar.schemas.trajectory import Trace, Trajectory, TrajectoryStatus

__all__ = [
    "AgentSpec",
    "BuilderSpec",
    "EvaluatorSpec",
    "GitSource",
    "ImageSource",
    "RuntimeSpec",
    "SessionFailure",
    "SessionResult",
    "SessionStatus",
    "StrategySpec",
    "TaskRequest",
    "TaskResult",
    "Trace",
    "Trajectory",
    "TrajectoryStatus",
    "WorkspaceSource",
]
