"""session_completed and test_on_output, grading real pytest runs in real runtimes."""

from __future__ import annotations

import itertools
import shutil
import sys
from pathlib import Path

import pytest

from polar.errors import ConfigError
from polar.evaluators.base import EvaluationContext, EvaluationResult, Evaluator
from polar.evaluators.registry import EVALUATORS, create_evaluator
from polar.evaluators.session_completed import SessionCompleted
from polar.evaluators.test_on_output import TestOnOutput
from polar.runtimes.base import Runtime
from polar.runtimes.registry import create_runtime
from polar.runtimes.snapshot import HostSnapshot
from polar.schemas.task import EvaluatorSpec, RuntimeSpec, TaskRequest
from polar.schemas.trajectory import Trace, Trajectory, TrajectoryStatus

GATEWAY = "http://127.0.0.1:9/gw"
BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = (
    "from calc import add\n\n"
    "def test_add():\n    assert add(2, 3) == 5\n\n"
    "def test_zero():\n    assert add(0, 0) == 0\n"
)
BOTH_PASS = {"tests/test_calc.py::test_add": "PASSED", "tests/test_calc.py::test_zero": "PASSED"}
TRACE = Trace(prompt_ids=[1], response_ids=[2], loss_mask=[1])


class Fixture:
    """A task whose workspace holds a bug and its tests, with a started runtime."""

    def __init__(self, tmp_path: Path, kind: str = "local", python: str = sys.executable):
        self.tmp_path = tmp_path
        self.python = python
        self.spec = RuntimeSpec(kind=kind, files={"calc.py": BUGGY, "tests/test_calc.py": TESTS})
        self.runtime = create_runtime(self.spec, tmp_path / "session", GATEWAY)
        self._fresh = itertools.count()

    def fresh(self) -> Runtime:
        return create_runtime(self.spec, self.tmp_path / f"fresh-{next(self._fresh)}", GATEWAY)

    def context(self, evaluator: EvaluatorSpec, status=TrajectoryStatus.COMPLETED, traces=(TRACE,)):
        task = TaskRequest(
            task_id="t", instruction="fix add", runtime=self.spec, evaluator=evaluator
        )
        return EvaluationContext(
            runtime=self.runtime,
            trajectory=Trajectory(status=status, traces=list(traces)),
            task=task,
            workspace=HostSnapshot(self.runtime.workspace_path),
            fresh_runtime=self.fresh,
        )

    def spec_for(self, refresh: bool = False, **config: object) -> EvaluatorSpec:
        config.setdefault("command", f"{self.python} -m pytest -rA -p no:cacheprovider tests")
        config.setdefault("expected", BOTH_PASS)
        return EvaluatorSpec(
            strategy="test_on_output",
            config=config,
            refresh_runtime=refresh,
            env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},  # evaluator env reaches the command
        )

    async def grade(self, refresh: bool = False, **config: object) -> EvaluationResult:
        spec = self.spec_for(refresh, **config)
        return await create_evaluator(spec).evaluate(self.context(spec))


@pytest.fixture
async def task(tmp_path: Path):
    fixture = Fixture(tmp_path)
    await fixture.runtime.start()
    yield fixture
    await fixture.runtime.stop()


async def test_unfixed_code_scores_by_all_or_fraction(task: Fixture):
    result = await task.grade()
    assert result.reward == 0.0 and result.passed is False
    assert result.details["mismatched"] == {
        "tests/test_calc.py::test_add": {"expected": "PASSED", "observed": "FAILED"}
    }
    fraction = await task.grade(reward="fraction")
    assert fraction.reward == 0.5 and fraction.passed is False


async def test_fixed_code_passes(task: Fixture):
    (task.runtime.workspace_path / "calc.py").write_text(FIXED)
    result = await task.grade()
    assert result.reward == 1.0 and result.passed is True
    assert result.details["outcomes"] == BOTH_PASS and result.details["refreshed"] is False


async def test_refresh_runtime_discards_edits_to_protected_tests(task: Fixture):
    tests = task.runtime.workspace_path / "tests" / "test_calc.py"
    tests.write_text("def test_add():\n    pass\n\ndef test_zero():\n    pass\n")  # cheating
    in_place = await task.grade()
    assert in_place.reward == 1.0  # grading where the agent worked is fooled
    refreshed = await task.grade(refresh=True, protected=["tests"])
    assert refreshed.reward == 0.0 and refreshed.passed is False
    assert refreshed.details["protected_changes_discarded"] == ["tests/test_calc.py"]
    assert tests.read_text().startswith(
        "def test_add():\n    pass"
    )  # the agent's copy is untouched


async def test_refresh_runtime_applies_the_agent_fix(task: Fixture):
    (task.runtime.workspace_path / "calc.py").write_text(FIXED)
    (task.runtime.workspace_path / "notes.md").write_text("fixed the sign")
    result = await task.grade(refresh=True, protected=["tests"])
    assert result.reward == 1.0 and result.details["applied"] == ["calc.py", "notes.md"]
    assert (task.tmp_path / "fresh-0" / "workspace" / "calc.py").read_text() == FIXED


async def test_without_expectations_the_exit_code_decides(task: Fixture):
    ok = await task.grade(command="test -f calc.py", expected={})
    bad = await task.grade(command="echo broken >&2; exit 2", expected={})
    assert (ok.reward, ok.passed) == (1.0, True)
    assert (bad.reward, bad.passed, bad.details["exit_code"]) == (0.0, False, 2)
    assert "broken" in bad.details["output_tail"]


async def test_a_hanging_test_command_times_out(task: Fixture):
    result = await task.grade(command="sleep 30", timeout_s=0.3)
    assert result.passed is False and result.details["timed_out"] is True
    assert result.details["mismatched"]["tests/test_calc.py::test_add"]["observed"] == "MISSING"


def test_config_is_strict():
    with pytest.raises(ConfigError, match="expected"):
        TestOnOutput(
            EvaluatorSpec(
                strategy="test_on_output", config={"command": "x", "expected": {"t": "OK"}}
            )
        )
    with pytest.raises(ConfigError, match="typo"):
        TestOnOutput(EvaluatorSpec(strategy="test_on_output", config={"command": "x", "typo": 1}))
    with pytest.raises(ConfigError, match="command"):
        TestOnOutput(EvaluatorSpec(strategy="test_on_output"))


async def test_session_completed(tmp_path: Path):
    fixture = Fixture(tmp_path)
    spec = EvaluatorSpec()
    evaluator = create_evaluator(spec)
    assert isinstance(evaluator, SessionCompleted)
    done = await evaluator.evaluate(fixture.context(spec))
    assert (done.reward, done.passed, done.details) == (
        1.0,
        True,
        {"status": "COMPLETED", "traces": 1},
    )
    for status, traces in ((TrajectoryStatus.TIMEOUT, (TRACE,)), (TrajectoryStatus.COMPLETED, ())):
        result = await evaluator.evaluate(fixture.context(spec, status=status, traces=traces))
        assert (result.reward, result.passed) == (0.0, False)


class Constant(Evaluator):
    name = "constant"

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationResult:
        return EvaluationResult(reward=float(self.spec.config["value"]), passed=None)


async def test_registry_names_and_import_paths(tmp_path: Path):
    assert EVALUATORS.names() == ["session_completed", "swe_tests", "test_on_output"]
    spec = EvaluatorSpec(strategy=f"{__name__}:Constant", config={"value": 0.25})
    result = await create_evaluator(spec).evaluate(Fixture(tmp_path).context(spec))
    assert result == EvaluationResult(reward=0.25, passed=None)
    with pytest.raises(ConfigError, match="unknown evaluator"):
        create_evaluator(EvaluatorSpec(strategy="swebench_v9"))


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")
async def test_refresh_in_a_bubblewrap_sandbox(tmp_path: Path):
    fixture = Fixture(tmp_path, kind="bubblewrap", python="python")  # the venv, bound read-only
    await fixture.runtime.start()
    try:
        (fixture.runtime.workspace_path / "calc.py").write_text(FIXED)
        (fixture.runtime.workspace_path / "tests" / "test_calc.py").write_text("")  # delete tests
        result = await fixture.grade(refresh=True, protected=["tests"])
    finally:
        await fixture.runtime.stop()
    assert result.reward == 1.0 and result.details["outcomes"] == BOTH_PASS
