"""Reward 1.0 when the session ran to completion and called the model at least once."""

from __future__ import annotations

from polar.evaluators.base import EvaluationContext, EvaluationResult, Evaluator
from polar.schemas.trajectory import TrajectoryStatus


class SessionCompleted(Evaluator):
    """A liveness signal, not a task grade: useful for smoke runs and SFT collection."""

    name = "session_completed"

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationResult:
        trajectory = ctx.trajectory
        passed = trajectory.status == TrajectoryStatus.COMPLETED and len(trajectory.traces) > 0
        return EvaluationResult(
            reward=1.0 if passed else 0.0,
            passed=passed,
            details={"status": str(trajectory.status), "traces": len(trajectory.traces)},
        )
