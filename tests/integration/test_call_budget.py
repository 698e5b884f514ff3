"""agent.max_model_calls on a real loopback deployment: the call past the cap is refused, the
harness is stopped whether or not it exits on the refusal, and the session ends TIMEOUT with
its calls so far as the partial trace, evaluated."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from integration.rollout_support.cluster import Cluster, shell_task, start_cluster
from polar.schemas.task import SessionFailure, SessionResult, SessionStatus

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) not installed"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("call-budget"), tokenizer)
    yield c
    c.stop()


def capped(task_id: str, cluster: Cluster, cap: int, mode: str = "normal") -> dict[str, Any]:
    body = shell_task(
        task_id, cluster.receiver, num_samples=1, timeout_s=60, agent_env={"AGENT_MODE": mode}
    )
    body["agent"]["max_model_calls"] = cap
    return body


@pytest.mark.parametrize("mode", ["normal", "stubborn"])
def test_the_call_past_the_cap_ends_the_session_as_timeout_with_its_partial_trace(
    cluster: Cluster, mode: str
) -> None:
    task_id = f"cap-{mode}"
    assert cluster.submit(capped(task_id, cluster, cap=1, mode=mode)).status_code == 201
    [raw] = cluster.wait_task(task_id, 45)["results"]
    result = SessionResult.model_validate(raw)
    assert result.status == SessionStatus.TIMEOUT
    assert result.failure == SessionFailure(kind="timeout", reason="model_calls_spent")
    assert "budget of 1 model calls ran out" in (result.error or "")
    assert result.node_id is not None
    records = cluster.nodes[result.node_id].store.records(result.session_id)
    assert len(records) == 1  # the refused call never reached the engine nor the store
    assert result.trajectory is not None
    assert result.trajectory.metadata["num_calls"] == 1
    [trace] = result.trajectory.traces
    assert trace.prompt_ids == records[0].prompt_ids
    assert [t for t, m in zip(trace.response_ids, trace.loss_mask, strict=True) if m] == (
        records[0].sampled_ids
    )
    assert result.reward == 1.0  # evaluated: the one tool call it made wrote hello.txt
    # The stubborn agent never exits by itself: the gateway stopped it, far inside 60 s.
    assert result.timing["total"] < 20


def test_a_cap_the_session_stays_under_changes_nothing(cluster: Cluster) -> None:
    assert cluster.submit(capped("cap-roomy", cluster, cap=5)).status_code == 201
    [raw] = cluster.wait_task("cap-roomy", 45)["results"]
    result = SessionResult.model_validate(raw)
    assert result.status == SessionStatus.COMPLETED and result.failure is None
    assert result.trajectory is not None and result.trajectory.metadata["num_calls"] == 2
