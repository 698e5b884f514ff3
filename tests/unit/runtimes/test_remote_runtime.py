"""A runtime whose sandbox lives elsewhere fits without touching evaluators: it keeps no host
path, hands its workspace over as a snapshot, and an evaluator grades the agent's work from
that snapshot (diffed against a fresh local tree, applied there, tests run for real)."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.errors import ConfigError
from polar.evaluators.base import EvaluationContext
from polar.evaluators.registry import create_evaluator
from polar.evaluators.swe_tests import _read_inside
from polar.runtimes.base import Runtime
from polar.runtimes.registry import (
    RUNTIMES,
    binds_host_paths,
    create_runtime,
    needs_image,
    unsandboxed_runtimes,
)
from polar.runtimes.snapshot import MemorySnapshot
from polar.schemas.task import EvaluatorSpec, RuntimeSpec, TaskRequest
from polar.schemas.trajectory import Trace, Trajectory, TrajectoryStatus
from unit.runtimes.remote_toy import ToyRemoteRuntime, registered

GATEWAY = "http://127.0.0.1:9/gw"
BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"


@pytest.fixture
def toy_remote() -> Iterator[None]:
    with registered():
        yield


async def test_an_evaluator_grades_a_remote_session_from_its_snapshot(
    toy_remote: None, tmp_path: Path
) -> None:
    remote_spec = RuntimeSpec(
        kind="toy_remote", files={"calc.py": BUGGY, "tests/test_calc.py": TESTS}
    )
    runtime = create_runtime(remote_spec, tmp_path / "never-made", GATEWAY)
    assert isinstance(runtime, ToyRemoteRuntime)
    await runtime.start()
    # The agent's session: it fixes the bug, and edits the test too (protected: discarded).
    cheat = "def test_add():\n    pass"
    await runtime.exec(f"echo {shlex.quote(FIXED.strip())} > calc.py")
    await runtime.exec(f"echo {shlex.quote(cheat)} > tests/test_calc.py")

    spec = EvaluatorSpec(
        strategy="test_on_output",
        refresh_runtime=True,
        config={
            "command": f"{sys.executable} -m pytest -q -p no:cacheprovider tests",
            "protected": ["tests"],
        },
    )
    local_spec = remote_spec.model_copy(update={"kind": "local"})
    fresh: list[Runtime] = []

    def fresh_runtime() -> Runtime:
        fresh.append(create_runtime(local_spec, tmp_path / f"fresh-{time.time_ns()}", GATEWAY))
        return fresh[-1]

    task = TaskRequest(task_id="t", instruction="fix add", runtime=remote_spec, evaluator=spec)
    ctx = EvaluationContext(
        runtime=runtime,
        trajectory=Trajectory(
            status=TrajectoryStatus.COMPLETED,
            traces=[Trace(prompt_ids=[1], response_ids=[2], loss_mask=[1])],
        ),
        task=task,
        workspace=await runtime.workspace_snapshot(),
        fresh_runtime=fresh_runtime,
    )
    result = await create_evaluator(spec).evaluate(ctx)

    assert result.passed is True and result.reward == 1.0, result.details
    assert result.details["applied"] == ["calc.py"]
    assert result.details["protected_changes_discarded"] == ["tests/test_calc.py"]
    assert not (tmp_path / "never-made").exists()
    assert (fresh[0].workspace_path / "calc.py").read_text() == FIXED


def test_the_registry_says_which_runtimes_need_an_image_or_do_not_sandbox(
    toy_remote: None,
) -> None:
    assert needs_image("docker") and needs_image("apptainer")
    assert not needs_image("bubblewrap") and not needs_image("toy_remote")
    assert unsandboxed_runtimes() == frozenset({"local"})
    # Who takes host paths bound in (a harness install) is the runtime's own options' fact.
    assert [kind for kind in RUNTIMES if binds_host_paths(kind)] == ["bubblewrap"]


def test_a_memory_snapshot_lists_reads_and_refuses_like_a_host_tree() -> None:
    snap = MemorySnapshot(
        {"a/b.py": b"x", "run.sh": b"#!"}, executable={"run.sh"}, links={"l": "/etc"}
    )
    listed = dict(snap.walk(lambda rel: rel == "a"))
    assert set(listed) == {"run.sh", "l"}
    assert snap.entry("a") is not None and snap.entry("a").kind == "dir"  # type: ignore[union-attr]
    assert listed["run.sh"].executable and listed["l"].target == "/etc"
    assert snap.read("a/b.py") == b"x"
    with pytest.raises(OSError):
        snap.read("l")
    with pytest.raises(OSError):
        snap.read("run.sh", limit=1)


def test_a_host_path_asked_of_a_runtime_without_one_names_it(tmp_path: Path) -> None:
    class Remote(ToyRemoteRuntime):
        workspace_path = Runtime.workspace_path  # the interface's own answer, not the toy's
        home_path = Runtime.home_path

    runtime = Remote(RuntimeSpec(kind="toy_remote"), tmp_path / "never", "http://127.0.0.1:9")
    for ask in (
        lambda: runtime.workspace_path,
        lambda: runtime.home_path,
        lambda: runtime.host_path("a.txt"),
    ):
        with pytest.raises(ConfigError, match="toy_remote runtime keeps its files off this host"):
            ask()
    assert create_runtime(RuntimeSpec(kind="local"), tmp_path / "l", "http://x").host_files


async def test_swe_tests_reads_the_test_log_a_remote_runtime_hands_over(
    toy_remote: None, tmp_path: Path
) -> None:
    spec = RuntimeSpec(kind="toy_remote", files={"run.log": "PASSED tests/t.py::x\n"})
    runtime = create_runtime(spec, tmp_path / "never-made", GATEWAY)
    await runtime.start()
    assert await _read_inside(runtime, "run.log") == "PASSED tests/t.py::x\n"
    assert await _read_inside(runtime, "missing.log") is None
    assert not (tmp_path / "never-made").exists()
