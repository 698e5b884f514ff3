"""A runtime whose sandbox lives elsewhere runs a whole session on a real node, with no host path.

The toy (:mod:`unit.runtimes.remote_toy`) stands for a pod or a sandbox service, registered by
one registry line, and fails the test if anything asks it for a host path. A task on it goes
the node's real way:
rollout server, dispatch, INIT -> READY -> RUNNING -> POSTRUN, the ``shell`` harness launched
through the runtime's exec, model calls through the session's model-API view into the gateway
and the scripted engine, the prefix-merging builder, and ``test_on_output`` grading a fresh
toy runtime onto which the agent's changes were replayed from ``workspace_snapshot()`` through
``workspace_writer()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.rollout_support.cluster import Cluster, shell_task, start_cluster
from polar.schemas.ids import path_segment
from polar.schemas.task import SessionResult, SessionStatus
from unit.runtimes.remote_toy import ToyRemoteRuntime, registered

pytestmark = pytest.mark.slow

STARTING_TREE = {"notes.txt": "scratch\n", "tests/check.txt": "honest\n"}
# The agent's whole run, in the toy's own shell: the model loop, then two edits of its own.
HARNESS = "agent && rm notes.txt && echo cheat > tests/check.txt"
GRADE = "test -f hello.txt && test ! -f notes.txt"


@pytest.fixture
def toy_remote() -> Iterator[list[ToyRemoteRuntime]]:
    with registered() as built:
        yield built


@pytest.fixture
def cluster(tmp_path: Path, tokenizer: Any) -> Iterator[Cluster]:
    c = start_cluster(tmp_path, tokenizer, node_ids=("a",))
    yield c
    c.stop()


def test_a_remote_runtime_runs_a_whole_session_on_a_node_with_no_host_path(
    toy_remote: list[ToyRemoteRuntime], cluster: Cluster
) -> None:
    task = shell_task(
        "remote",
        cluster.receiver,
        num_samples=1,
        runtime={"kind": "toy_remote", "files": STARTING_TREE},
        evaluator={
            "strategy": "test_on_output",
            "refresh_runtime": True,
            "config": {"command": GRADE, "protected": ["tests"]},
        },
    )
    task["agent"]["settings"]["command"] = HARNESS
    reply = cluster.submit(task)
    assert reply.status_code == 201, reply.text
    [raw] = cluster.wait_task("remote", timeout_s=60)["results"]
    result = SessionResult.model_validate(raw)

    assert result.status == SessionStatus.COMPLETED, result.error
    assert result.reward == 1.0 and result.passed, result.evaluation
    assert result.session_dir is None  # nothing of the session is on the node's disk
    assert result.evaluation is not None
    details = result.evaluation.details
    assert details["refreshed"] is True
    assert sorted(details["applied"]) == ["hello.txt", "notes.txt"]  # made, and deleted
    assert details["protected_changes_discarded"] == ["tests/check.txt"]

    session, fresh = toy_remote  # the session's runtime, then the evaluator's fresh one
    assert session.calls == 2  # a tool call, then the final answer
    assert session.remote["hello.txt"] == b"hello\n"  # the model's tool call, run by the toy
    assert session.made == [
        f"{session.home}/.polar/artifacts",
        f"{session.home}/.polar/logs",
    ]
    # The fresh runtime got the agent's changes, not its edit of a protected test.
    assert fresh.remote == {"hello.txt": b"hello\n", "tests/check.txt": b"honest\n"}
    work_dir = cluster.tmp / "node-a" / "sessions"  # no session dir, no evaluation copy
    assert not list(work_dir.glob(f"{path_segment(result.session_id)}*"))

    trajectory = result.trajectory
    assert trajectory is not None and trajectory.status == "COMPLETED"
    [trace] = trajectory.traces  # two calls merged into one trace
    assert trace.metadata["num_calls"] == 2 and trace.reward == 1.0
    records = cluster.nodes["a"].store.records(result.session_id)
    sampled = [t for rec in records for t in rec.sampled_ids]
    trainable = [t for t, m in zip(trace.response_ids, trace.loss_mask, strict=True) if m]
    assert trainable == sampled  # exactly the engine's sampled tokens
