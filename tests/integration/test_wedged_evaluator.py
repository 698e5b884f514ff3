"""A custom ``module:Class`` evaluator that blocks for good in a thread costs only evaluator
capacity, and a POST-RUN that runs past its bound while evaluating keeps the trajectory it
built. On a real node (rollout server, gateway, local runtime), more sessions than the loop's
default executor has threads each wedge their evaluator on an Event that is never set. Before,
each wedge held one of those threads (``asyncio.to_thread``'s), so the next session's INIT and
every other ``to_thread`` on the node waited for good; and the wedged sessions came back
with no trajectory although POST-RUN had built one."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.rollout_support.cluster import Cluster, start_cluster
from polar.evaluators.base import EvaluationContext, EvaluationResult, Evaluator
from polar.schemas.task import SessionFailure, SessionResult, SessionStatus

pytestmark = pytest.mark.slow

WEDGE = threading.Event()  # never set while the test runs: set at teardown to free the threads
# One more wedge than asyncio's default executor has threads (min(32, cpus + 4)).
WEDGES = min(32, (os.cpu_count() or 1) + 4) + 1


class WedgedEvaluator(Evaluator):
    """Blocks in a thread until released, like a read of a FIFO or a hung socket would."""

    name = "wedged"

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationResult:
        await asyncio.to_thread(WEDGE.wait)
        return EvaluationResult(reward=1.0, passed=True)


@pytest.fixture
def cluster(tmp_path: Path, tokenizer: Any) -> Iterator[Cluster]:
    workers = {
        "init_workers": 2,
        "run_workers": 4,
        "ready_buffer": 2,
        "postrun_workers": 4,
        "evaluator_threads": 2,
    }
    WEDGE.clear()
    c = start_cluster(tmp_path, tokenizer, node_ids=("a",), workers=workers)
    yield c
    WEDGE.set()
    c.stop()


def task(task_id: str, evaluator: str, samples: int = 1) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "instruction": "x",
        "num_samples": samples,
        "timeout_seconds": 60,
        "runtime": {"kind": "local"},
        "agent": {"harness": "shell", "settings": {"command": "echo done > done.txt"}},
        "evaluator": {"strategy": evaluator, "timeout_seconds": 1.0},
    }


def test_wedged_evaluators_cost_only_evaluator_threads_and_keep_their_trajectory(
    cluster: Cluster,
) -> None:
    wedged = f"{__name__}:WedgedEvaluator"
    reply = cluster.submit(task("wedged", wedged, samples=WEDGES))
    assert reply.status_code == 201, reply.text
    results = [SessionResult.model_validate(r) for r in cluster.wait_task("wedged", 120)["results"]]
    assert len(results) == WEDGES
    for result in results:
        assert result.status == SessionStatus.ERROR, result
        assert result.failure == SessionFailure(kind="evaluator", reason="evaluator_timeout")
        assert result.reward is None
        # Built before the evaluator wedged: kept, with no reward on it.
        assert result.trajectory is not None, result
        assert result.trajectory.metadata["session_id"] == result.session_id
        assert all(trace.reward is None for trace in result.trajectory.traces)

    # Every wedged thread is still blocked; the node still starts, runs and grades sessions.
    reply = cluster.submit(task("honest", "session_completed"))
    assert reply.status_code == 201, reply.text
    [raw] = cluster.wait_task("honest", 60)["results"]
    assert SessionResult.model_validate(raw).status == SessionStatus.COMPLETED, raw
