"""The public wire contract (pydantic models); names here are stable."""

from polar.schemas.task import (
    AgentSpec,
    BuilderSpec,
    EvaluationSummary,
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
from polar.schemas.trajectory import (
    Trace,
    TraceStats,
    Trajectory,
    TrajectoryStats,
    TrajectoryStatus,
)

__all__ = [
    "AgentSpec",
    "BuilderSpec",
    "EvaluationSummary",
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
    "TraceStats",
    "Trajectory",
    "TrajectoryStats",
    "TrajectoryStatus",
    "WorkspaceSource",
]
