"""Faults on a real loopback deployment: budget overrun, crashes, broken runtimes and
evaluators, a node killed mid-task, a callback receiver that is down, duplicate dispatch.
In every case the task completes and nothing the gateway captured is lost."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from integration.rollout_support.cluster import AGENT, Cluster, shell_task, start_cluster
from polar.capture.store import CaptureStore
from polar.schemas.node import SessionDispatch
from polar.schemas.task import SessionFailure, SessionResult, SessionStatus, TaskRequest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) not installed"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("faults"), tokenizer)
    yield c
    c.stop()


def only_result(cluster: Cluster, task_id: str, timeout_s: float = 30) -> SessionResult:
    body = cluster.wait_task(task_id, timeout_s)
    [result] = [SessionResult.model_validate(r) for r in body["results"]]
    return result


def captured(cluster: Cluster, result: SessionResult) -> int:
    assert result.node_id is not None
    return len(cluster.nodes[result.node_id].store.records(result.session_id))


def test_failures_end_as_clear_results_with_what_was_captured(cluster: Cluster) -> None:
    recv = cluster.receiver
    tasks = {
        "budget": shell_task(
            "budget", recv, num_samples=1, timeout_s=3, agent_env={"AGENT_MODE": "hang"}
        ),
        "crash": shell_task("crash", recv, num_samples=1, agent_env={"AGENT_MODE": "crash"}),
        "boot": shell_task(
            "boot",
            recv,
            num_samples=1,
            runtime={"kind": "bubblewrap", "files": {"agent.py": AGENT}, "prepare": ["exit 5"]},
        ),
        "grader": shell_task(
            "grader",
            recv,
            num_samples=1,
            evaluator={"strategy": "integration.rollout_support.faulty:RaisingEvaluator"},
        ),
    }
    for body in tasks.values():
        assert cluster.submit(body).status_code == 201

    budget = only_result(cluster, "budget")
    assert budget.status == SessionStatus.TIMEOUT
    assert "budget of 3s ran out during run" in (budget.error or "")
    assert budget.trajectory is not None and budget.trajectory.status == "TIMEOUT"
    assert budget.trajectory.metadata["num_calls"] == captured(cluster, budget) == 1
    assert len(budget.trajectory.traces) == 1
    assert budget.reward == 0.0  # evaluated: the tool call never ran, no hello.txt
    assert 2.5 < budget.timing["total"] < 10
    assert budget.failure == SessionFailure(kind="timeout", reason="budget_exhausted")

    crash = only_result(cluster, "crash")
    assert crash.status == SessionStatus.ERROR
    assert "exited with status 7" in (crash.error or "")
    assert "agent crashed on purpose" in (crash.error or "")
    assert crash.trajectory is not None and crash.trajectory.status == "ERROR"
    assert crash.trajectory.metadata["num_calls"] == captured(cluster, crash) == 1
    assert crash.failure == SessionFailure(kind="agent", reason="harness_failed")

    boot = only_result(cluster, "boot")
    assert boot.status == SessionStatus.ERROR
    assert "init failed" in (boot.error or "") and "exit 5" in (boot.error or "")
    assert boot.trajectory is None and captured(cluster, boot) == 0
    assert boot.failure == SessionFailure(kind="infra", reason="runtime_start_failed")

    grader = only_result(cluster, "grader")
    assert grader.status == SessionStatus.ERROR
    assert "evaluator failed" in (grader.error or "") and "grader exploded" in (grader.error or "")
    assert grader.reward is None
    assert grader.trajectory is not None and len(grader.trajectory.traces) == 1
    assert grader.trajectory.metadata["num_calls"] == captured(cluster, grader) == 2
    assert grader.failure == SessionFailure(kind="evaluator", reason="evaluator_failed")


def dispatch_body(session_id: str, **agent_env: str) -> str:
    task = TaskRequest.model_validate(
        shell_task("direct", _NoReceiver(), num_samples=1, agent_env=agent_env)
    )
    return SessionDispatch(session_id=session_id, task=task).model_dump_json()


JSON = {"content-type": "application/json"}


class _NoReceiver:
    url = "http://127.0.0.1:9/unused"


def test_duplicate_dispatch_starts_once_and_delete_cancels(cluster: Cluster) -> None:
    node = cluster.nodes["a"]
    sid = "ps-duplicate-dispatch-test-0001"
    first = httpx.post(
        f"{node.url}/polar/node/sessions",
        content=dispatch_body(sid),
        headers=JSON | node.headers(),
        timeout=10,
    )
    again = httpx.post(
        f"{node.url}/polar/node/sessions",
        content=dispatch_body(sid),
        headers=JSON | node.headers(),
        timeout=10,
    )
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["session_id"] == sid
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        detail = httpx.get(f"{node.url}/polar/node/sessions/{sid}", headers=node.headers()).json()
        if detail["result"] is not None:
            break
        time.sleep(0.1)
    assert detail["result"]["status"] == "COMPLETED"
    assert len(node.store.records(sid)) == 2  # one run: one tool call, one final answer
    listed = [
        s["session_id"]
        for s in httpx.get(f"{node.url}/polar/node/sessions", headers=node.headers()).json()
    ]
    assert listed.count(sid) == 1

    hung = "ps-cancel-me-test-000000000001"
    httpx.post(
        f"{node.url}/polar/node/sessions",
        content=dispatch_body(hung, AGENT_MODE="hang"),
        headers=JSON | node.headers(),
        timeout=10,
    )
    deadline = time.monotonic() + 20
    while not node.store.records(hung) and time.monotonic() < deadline:
        time.sleep(0.05)  # wait for its first model call; then it hangs
    began = time.monotonic()
    assert (
        httpx.delete(f"{node.url}/polar/node/sessions/{hung}", headers=node.headers()).status_code
        == 200
    )
    while (
        detail := httpx.get(f"{node.url}/polar/node/sessions/{hung}", headers=node.headers()).json()
    )["result"] is None:
        time.sleep(0.05)
    assert time.monotonic() - began < 5
    assert detail["result"]["status"] == "ERROR" and detail["result"]["error"] == "cancelled"
    assert detail["result"]["failure"] == {"kind": "infra", "reason": "cancelled"}
    assert len(node.store.records(hung)) == 1  # what it captured before the cancel is kept


def test_deleting_a_task_cancels_its_sessions_on_their_nodes(cluster: Cluster) -> None:
    """DELETE /tasks/{id} reaches the nodes: every session stops within seconds, ends ERROR
    with failure infra/cancelled, and keeps what it captured (the node built it)."""
    calls_before = sum(e.calls for e in cluster.engines.values())
    body = shell_task(
        "cancel-me", cluster.receiver, num_samples=4, agent_env={"AGENT_MODE": "hang"}
    )
    assert cluster.submit(body).status_code == 201
    deadline = time.monotonic() + 20
    while sum(e.calls for e in cluster.engines.values()) < calls_before + 4:
        assert time.monotonic() < deadline, "the agents did not make their first call"
        time.sleep(0.05)  # every agent made its one call and now hangs
    began = time.monotonic()
    reply = httpx.delete(f"{cluster.url}/tasks/cancel-me", headers=cluster.headers(), timeout=10)
    assert reply.status_code == 200, reply.text
    results = [
        SessionResult.model_validate(r) for r in cluster.wait_task("cancel-me", 15)["results"]
    ]
    assert time.monotonic() - began < 10  # not the 30 s budget
    assert len(results) == 4
    for r in results:
        assert r.status == SessionStatus.ERROR and r.error == "cancelled"
        assert r.failure == SessionFailure(kind="infra", reason="cancelled")
        assert r.trajectory is not None and captured(cluster, r) == 1  # kept, built by the node
    again = httpx.delete(f"{cluster.url}/tasks/cancel-me", headers=cluster.headers(), timeout=10)
    assert again.status_code == 200 and again.json()["counts"] == {"ERROR": 4}
    assert cluster.submit(body).status_code == 200  # the same request: the cancelled task
    assert cluster.submit({**body, "num_samples": 1}).status_code == 409
    time.sleep(0.3)
    cancelled = {r.session_id for r in results}
    keys = [c["key"] for c in cluster.receiver.received if c["key"] in cancelled]
    assert sorted(keys) == sorted(cancelled)  # each reported once


def test_killed_node_sessions_fail_after_grace_and_the_task_completes(
    tmp_path: Path, tokenizer: Any
) -> None:
    c = start_cluster(tmp_path, tokenizer, heartbeat_timeout_s=0.6, node_grace_s=1.5)
    try:
        body = shell_task(
            "kill", c.receiver, num_samples=4, timeout_s=6, agent_env={"AGENT_MODE": "hang"}
        )
        assert c.submit(body).status_code == 201
        deadline = time.monotonic() + 20
        while sum(e.calls for e in c.engines.values()) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)  # every agent made its one call and now hangs
        assert all(e.calls for e in c.engines.values()), "both nodes must hold sessions"
        c.nodes["b"].kill()
        c.stopped.append("b")
        killed_at = time.monotonic()
        result = c.wait_task("kill", timeout_s=30)
        results = [SessionResult.model_validate(r) for r in result["results"]]
        by_node = {n: [r for r in results if r.node_id == n] for n in ("a", "b")}
        assert len(results) == 4 and by_node["a"] and by_node["b"]
        on_disk = CaptureStore(c.nodes["b"].store.path)  # the dead node's captures survive
        for r in by_node["b"]:
            assert r.status == SessionStatus.ERROR and "no heartbeat" in (r.error or "")
            assert r.failure == SessionFailure(kind="infra", reason="node_dead")
            assert len(on_disk.records(r.session_id)) == 1
        on_disk.close()
        assert all(r.status == SessionStatus.TIMEOUT for r in by_node["a"])
        assert all(r.failure and r.failure.kind == "timeout" for r in by_node["a"])
        assert time.monotonic() - killed_at < 15
    finally:
        c.stop()


def test_callback_receiver_down_then_up_gets_each_result_once(
    tmp_path: Path, tokenizer: Any
) -> None:
    c = start_cluster(tmp_path, tokenizer, receiver_up=False)
    try:
        assert c.submit(shell_task("late", c.receiver, num_samples=2)).status_code == 201
        body = c.wait_task("late")
        time.sleep(0.5)  # several delivery attempts fail: connection refused
        c.receiver.start()
        deadline = time.monotonic() + 15
        while len(c.receiver.received) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # a duplicate would arrive within the backoff cap
        keys = sorted(r["key"] for r in c.receiver.received)
        assert keys == sorted(r["session_id"] for r in body["results"])
    finally:
        c.stop()
