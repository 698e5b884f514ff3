"""``LocalRun``, the skeleton ``polar quickstart`` and ``polar generate`` share: a real stack in
front of the scripted engine (with SmolLM2's real tokenizer), real shell sessions as local
processes; what following a run returns, and the teardown order that still delivers the
results of sessions cut short."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from rich.console import Console

from polar.engines.registry import EngineConfig
from polar.engines.scripted import ScriptedBackend, ScriptedEngine
from polar.rendering.model_files import load_tokenizer
from polar.schemas.sampling import SamplingPolicy
from polar.schemas.task import AgentSpec, RuntimeSpec, SessionStatus, TaskRequest
from polar.stack.plan import EngineHandle, HarnessPlan
from polar.stack.run import LocalRun, RunSetup

pytestmark = pytest.mark.slow  # real servers on loopback, real shell sessions


def _setup(closed: list[bool]) -> RunSetup:
    tokenizer = load_tokenizer()
    engine = EngineHandle(
        engine=ScriptedEngine(ScriptedBackend(tokenizer=tokenizer)),
        config=EngineConfig(kind="scripted"),
        label="scripted",
        served_model=None,
        context_window=8192,
        tokenizer=tokenizer,
        close=lambda: closed.append(True),
    )
    agent = AgentSpec(harness="shell", model_name="smollm2")
    return RunSetup("local", engine, HarnessPlan("shell", agent))


def _task(task_id: str, command: str, samples: int) -> TaskRequest:
    return TaskRequest(
        task_id=task_id,
        instruction="x",
        num_samples=samples,
        timeout_seconds=60,
        runtime=RuntimeSpec(kind="local"),
        agent=AgentSpec(harness="shell", model_name="smollm2", settings={"command": command}),
    )


def _run(setup: RunSetup, tmp_path: Path, out: io.StringIO) -> LocalRun:
    return LocalRun(
        setup,
        tmp_path / "run",
        Console(file=out, width=200),
        sampling=SamplingPolicy(max_tokens=16),
        run_workers=2,
        ready_buffer=0,
    )


def test_a_run_follows_its_tasks_to_the_end_then_winds_down(tmp_path: Path) -> None:
    closed: list[bool] = []
    out = io.StringIO()
    run = _run(_setup(closed), tmp_path, out)
    with run:
        followed = run.follow(
            [_task("done", "true", 2)],
            lambda ids: bool(run.client.wait(ids, 60)),
            on_interrupt="stopping",
        )
        assert followed.submitted == ["done"] and followed.finished
        assert not followed.interrupted
        assert closed == [True] and run.stack.gateway is None  # wound down, server still up
        results = run.client.result("done").results
    assert [r.status for r in results] == [SessionStatus.COMPLETED] * 2
    assert run.stack.rollout is None
    assert "deadline" not in out.getvalue()


def _running(run: LocalRun, task_ids: list[str], timeout_s: float = 30.0) -> bool:
    """Wait until every session of ``task_ids`` runs on the node (a stand-in for a watch
    whose deadline passes while sessions still run)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        views = [v for t in task_ids for v in run.client.sessions(t)]
        if views and all(v.status == SessionStatus.RUNNING for v in views):
            return True
        time.sleep(0.1)
    return False


def test_a_deadline_passing_is_said_and_not_finished(tmp_path: Path) -> None:
    closed: list[bool] = []
    out = io.StringIO()
    with _run(_setup(closed), tmp_path, out) as run:
        followed = run.follow(
            [_task("slow", "sleep 30", 1)], lambda ids: not _running(run, ids), on_interrupt=""
        )
        results = run.client.result("slow").results
    assert not followed.finished and not followed.interrupted
    assert "the run's deadline passed" in out.getvalue()
    # Stopping the gateway cancelled the session and still delivered its result.
    assert [r.status.finished for r in results] == [True]
    assert results[0].status != SessionStatus.COMPLETED


def test_ctrl_c_is_caught_said_and_the_engine_it_does_not_own_stays_open(tmp_path: Path) -> None:
    closed: list[bool] = []
    setup = _setup(closed)
    setup.owns_engine = False
    out = io.StringIO()
    heard: list[bool] = []

    def interrupt(ids: list[str]) -> bool:
        raise KeyboardInterrupt

    with _run(setup, tmp_path, out) as run:
        followed = run.follow(
            [_task("a", "sleep 30", 1), _task("b", "sleep 30", 1)],
            interrupt,
            on_interrupt="keeping what finished",
            after_interrupt=lambda: heard.append(True),
        )
        # Both tasks were submitted before the interrupt, and the server still answers for them.
        summaries = [run.client.summary(t) for t in followed.submitted]
    assert followed.interrupted and followed.submitted == ["a", "b"]
    assert heard == [True] and closed == []
    assert "interrupted: keeping what finished" in out.getvalue()
    assert [s.task_id for s in summaries] == ["a", "b"]
