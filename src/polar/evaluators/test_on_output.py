"""Run a test command in the runtime and grade its per-test outcomes against expectations.

Config (``evaluator.config``):

- ``command``: the test command, run in the workdir (e.g. ``python -m pytest -rA tests``);
- ``expected``: test id -> ``PASSED`` or ``FAILED``; empty means "the command exits 0";
- ``reward``: ``all`` (1.0 only if every expectation holds) or ``fraction`` (share that hold);
- ``timeout_s``, ``cwd``;
- ``protected``: patterns of paths (the tests, conftest files) whose agent edits are discarded
  when ``evaluator.refresh_runtime`` is set; ``ignore``: paths never diffed (``.git``, caches).

With ``refresh_runtime`` the tests do not run where the agent worked: a fresh runtime is
started from the task's spec, the agent's file changes are copied onto it except protected
paths, and the tests run there, so an agent cannot win by editing the tests.

SWE-bench instances are graded by :mod:`polar.evaluators.swe_tests` instead, with the
``swebench`` package's log parsers and its FAIL_TO_PASS / PASS_TO_PASS rules.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from polar.evaluators.base import EvaluationContext, EvaluationResult, Evaluator, parse_config
from polar.evaluators.test_outcomes import grade, parse_pytest_outcomes
from polar.evaluators.workspace_diff import DEFAULT_IGNORE, apply_diff, diff_trees
from polar.runtimes.base import ExecResult, Runtime, tail_text
from polar.schemas.task import EvaluatorSpec

_OUTPUT_TAIL = 4000


class TestOnOutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str
    expected: dict[str, Literal["PASSED", "FAILED"]] = Field(default_factory=dict)
    reward: Literal["all", "fraction"] = "all"
    timeout_s: float | None = Field(600.0, gt=0)
    cwd: str | None = None
    protected: list[str] = Field(default_factory=list)
    ignore: list[str] = Field(default_factory=lambda: list(DEFAULT_IGNORE))


class TestOnOutput(Evaluator):
    name = "test_on_output"
    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, spec: EvaluatorSpec) -> None:
        super().__init__(spec)
        self.config = parse_config(TestOnOutputConfig, spec)

    def parse(self, output: str) -> dict[str, str]:
        """Test id -> outcome; override for runners other than pytest."""
        return parse_pytest_outcomes(output)

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationResult:
        if not self.spec.refresh_runtime:
            return self._score(await self._run_tests(ctx.runtime), {"refreshed": False})
        fresh = ctx.fresh_runtime()
        try:
            await fresh.start()
            base = await fresh.workspace_snapshot()
            diff = await asyncio.to_thread(diff_trees, ctx.workspace, base, self.config.ignore)
            report = await asyncio.to_thread(
                apply_diff, diff, ctx.workspace, fresh.workspace_writer(), self.config.protected
            )
            result = await self._run_tests(fresh)
        finally:
            await fresh.stop()
        return self._score(
            result,
            {
                "refreshed": True,
                "applied": report.applied,
                "protected_changes_discarded": report.protected,
                "conflicts": report.conflicts,
            },
        )

    async def _run_tests(self, runtime: Runtime) -> ExecResult:
        return await runtime.exec(
            self.config.command,
            env=self.spec.env or None,
            timeout_s=self.config.timeout_s,
            cwd=self.config.cwd,
        )

    def _score(self, result: ExecResult, extra: dict[str, object]) -> EvaluationResult:
        details: dict[str, object] = {
            **extra,
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "output_tail": tail_text(result.stdout + result.stderr, _OUTPUT_TAIL),
        }
        if not self.config.expected:
            return EvaluationResult(reward=float(result.ok), passed=result.ok, details=details)
        outcomes = self.parse(result.stdout + "\n" + result.stderr)
        graded = grade(outcomes, self.config.expected)
        details.update(
            outcomes=outcomes,
            matched=len(graded.matched),
            total=graded.total,
            mismatched=graded.mismatched,
        )
        if self.config.reward == "fraction":
            reward = len(graded.matched) / graded.total
        else:
            reward = float(graded.all_matched)
        return EvaluationResult(reward=reward, passed=graded.all_matched, details=details)
