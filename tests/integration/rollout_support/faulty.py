"""An evaluator that raises, for the fault tests (loaded by ``module:Class``)."""

from __future__ import annotations

from polar.evaluators.base import EvaluationContext, EvaluationResult, Evaluator


class RaisingEvaluator(Evaluator):
    name = "raising"

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationResult:
        raise RuntimeError("grader exploded")
