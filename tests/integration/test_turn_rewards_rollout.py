"""Per-turn reward hooks named by a TaskRequest run on the gateway node after the build, and
their scores come back on the session's trace, aligned with the scored call's sampled ids."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.rollout_support.cluster import Cluster, shell_task, start_cluster
from polar.schemas.task import SessionResult, SessionStatus

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) not installed"),
]


@pytest.fixture
def cluster(tmp_path: Path, tokenizer: Any) -> Iterator[Cluster]:
    c = start_cluster(tmp_path, tokenizer, admin_token="admin-secret")
    yield c
    c.stop()


def test_tool_errors_hook_scores_the_tool_call_turn(cluster: Cluster) -> None:
    task = shell_task("turns", cluster.receiver, num_samples=1)
    task["turn_rewards"] = [{"strategy": "tool_errors"}]
    assert cluster.submit(task).status_code == 201
    body = cluster.wait_task("turns", timeout_s=60)
    (result,) = [SessionResult.model_validate(r) for r in body["results"]]
    assert result.status == SessionStatus.COMPLETED, result.error
    assert result.trajectory is not None
    assert result.trajectory.metadata["turn_rewards"] == 1
    (trace,) = result.trajectory.traces
    (turn,) = trace.turn_rewards
    first = cluster.nodes[result.node_id].store.records(result.session_id)[0]
    assert turn.completion_id == first.completion_id and turn.source == "tool_errors"
    assert turn.reward == 0.0 and turn.details["failed_tool_calls"] == []
    assert trace.response_ids[turn.start : turn.end] == first.sampled_ids
