"""The suite's checker: a bash check in the workspace that can also read the agent's answer.

It is ``test_on_output`` with one addition: the agent's last reply is in ``$FINAL_ANSWER``
while the check runs. File tasks look at the workspace; question tasks grep the answer, which
any harness produces whether or not the model manages a tool call (a 135M model rarely does).
Tasks name it by import path, ``polar.quickstart.tasks.checker:SuiteCheck``, the way any user
plugs in an evaluator of their own.
"""

from __future__ import annotations

from typing import Any

from polar.evaluators.base import EvaluationContext, EvaluationResult
from polar.evaluators.test_on_output import TestOnOutput
from polar.schemas.trajectory import Trajectory

IMPORT_PATH = "polar.quickstart.tasks.checker:SuiteCheck"
ANSWER_VAR = "FINAL_ANSWER"
ANSWER_LIMIT = 8000


class SuiteCheck(TestOnOutput):
    name = "suite_check"

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationResult:
        answer = final_answer(ctx.trajectory)[-ANSWER_LIMIT:]
        self.spec = self.spec.model_copy(update={"env": {**self.spec.env, ANSWER_VAR: answer}})
        result = await super().evaluate(ctx)
        return EvaluationResult(
            reward=result.reward,
            passed=result.passed,
            details={**result.details, "final_answer": answer[-500:]},
        )


def final_answer(trajectory: Trajectory) -> str:
    """The text of the agent's last reply: the last assistant message of the last agent trace
    (side calls such as title generation are not the agent's answer); '' if there is none."""
    for trace in reversed(trajectory.traces):
        if trace.stats.side_call:
            continue
        for message in reversed(trace.response_messages):
            if message.get("role") == "assistant":
                return _text(message.get("content"))
    return ""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""
