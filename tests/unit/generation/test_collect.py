"""The collector: each finished session becomes one ledger line as it arrives, under the
attempt index its sample stands for."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from polar.capture.store import CaptureStore
from polar.client import RolloutClient
from polar.errors import ConfigError
from polar.generation.attempts import Ledger, read_ledger
from polar.generation.collect import Collector, TaskPlan
from polar.generation.run import run_task_id, select_instances
from polar.schemas.ids import is_valid_id
from polar.schemas.rollout import TaskSummary
from polar.schemas.task import SessionResult, SessionStatus, TaskResult, TaskStatus
from polar.swe.instances import SWEInstance

from .results import result


class FakeServer:
    """What the rollout server and the capture store answer, as sessions finish."""

    def __init__(self, plans: list[TaskPlan]) -> None:
        self.samples = {p.task_id: len(p.attempts) for p in plans}
        self.finished: dict[str, list[SessionResult]] = {p.task_id: [] for p in plans}
        self.result_reads = 0

    def finish(self, res: SessionResult) -> None:
        self.finished[res.task_id].append(res)

    def tasks(self) -> list[TaskSummary]:
        out = []
        for task_id, n in self.samples.items():
            done = len(self.finished[task_id])
            counts = {
                "COMPLETED": done,
                "RUNNING": min(1, n - done),
                "REGISTERED": max(n - done - 1, 0),
            }
            status = TaskStatus.COMPLETED if done == n else TaskStatus.RUNNING
            out.append(
                TaskSummary(
                    task_id=task_id,
                    status=status,
                    num_samples=n,
                    counts=counts,
                    created_at=0.0,
                    finished_at=None,
                )
            )
        return out

    def result(self, task_id: str) -> TaskResult:
        self.result_reads += 1
        return TaskResult(
            task_id=task_id, status=TaskStatus.RUNNING, results=self.finished[task_id]
        )

    def summaries(self, session_id: str) -> list[dict[str, Any]]:
        return [{"n_prompt": 100, "n_sampled": 7}, {"n_prompt": 150, "n_sampled": 3}]


def test_sessions_are_recorded_as_they_finish(tmp_path: Path) -> None:
    plans = [TaskPlan("a-r2", "a", "o/a", [1, 3]), TaskPlan("b-r2", "b", "o/b", [0])]
    server = FakeServer(plans)
    ledger = Ledger(tmp_path)
    heard: list[tuple[str, int]] = []
    collector = Collector(ledger, plans, run=2, on_record=lambda r: heard.append(r.key))
    collector.connect(cast(RolloutClient, server), cast(CaptureStore, server))

    collector.poll()
    assert collector.records == [] and server.result_reads == 0
    assert collector.stage_counts() == {
        "o/a": {"queued": 1, "running": 1},
        "o/b": {"queued": 0, "running": 1},
    }

    workspace = tmp_path / "sessions" / "s-a1" / "workspace"
    (workspace / "pkg").mkdir(parents=True)
    (tmp_path / "sessions" / "s-a1-eval0" / "workspace").mkdir(parents=True)
    (tmp_path / "sessions" / "s-a1" / "logs").mkdir()
    server.finish(
        result(session_id="s-a1", task_id="a-r2", sample=1, session_dir=str(workspace.parent))
    )
    collector.poll()
    # On disk before the others finish: an interrupted run keeps it.
    assert list(read_ledger(ledger.path)) == [("a", 3)]
    assert heard == [("a", 3)]
    assert not workspace.exists() and not (tmp_path / "sessions/s-a1-eval0/workspace").exists()
    assert (tmp_path / "sessions" / "s-a1" / "logs").is_dir()
    assert not collector.done

    server.finish(result(session_id="s-b0", task_id="b-r2", sample=0, passed=False))
    server.finish(result(session_id="s-a0", task_id="a-r2", sample=0, status=SessionStatus.TIMEOUT))
    collector.poll()
    collector.poll()  # nothing new: nothing recorded twice
    assert collector.done
    records = read_ledger(ledger.path)
    assert sorted(records) == [("a", 1), ("a", 3), ("b", 0)]
    assert len(ledger.path.read_text().splitlines()) == 3
    a1 = records[("a", 1)]
    assert (a1.session_id, a1.status, a1.accepted, a1.run) == (
        "s-a0",
        SessionStatus.TIMEOUT,
        False,
        2,
    )
    assert (a1.prompt_tokens, a1.sampled_tokens, a1.calls) == (250, 10, 2)
    assert records[("a", 3)].accepted and not records[("b", 0)].accepted
    assert ledger.load_result(records[("b", 0)]).session_id == "s-b0"


def test_task_ids_are_valid_and_differ_by_run() -> None:
    for instance_id in ("django__django-11099", "o__r.1234.func_pm__x"):
        ids = {run_task_id(instance_id, run) for run in (1, 2)}
        assert len(ids) == 2 and all(is_valid_id(i) for i in ids)


def instance(instance_id: str) -> SWEInstance:
    return SWEInstance(instance_id=instance_id, repo="o/r")


def test_select_instances() -> None:
    pool = [instance("a"), instance("b"), instance("a"), instance("c")]
    assert [i.instance_id for i in select_instances(pool, (), None)] == ["a", "b", "c"]
    assert [i.instance_id for i in select_instances(pool, ("c", "a"), None)] == ["a", "c"]
    assert [i.instance_id for i in select_instances(pool, (), 2)] == ["a", "b"]
    with pytest.raises(ConfigError, match="zz"):
        select_instances(pool, ("a", "zz"), None)
