"""End to end on loopback: rollout server + two gateway nodes + scripted engine + the ``shell``
harness running a scripted agent in bubblewrap; four samples come back complete."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
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


def test_four_samples_end_to_end(cluster: Cluster) -> None:
    reply = cluster.submit(shell_task("hello", cluster.receiver))
    assert reply.status_code == 201, reply.text
    again = cluster.submit(shell_task("hello", cluster.receiver))  # a retry: the same task
    assert again.status_code == 200 and again.json()["created_at"] == reply.json()["created_at"]
    other = cluster.submit(shell_task("hello", cluster.receiver, num_samples=2))
    assert other.status_code == 409 and "different request" in other.json()["detail"]
    body = cluster.wait_task("hello", timeout_s=60)

    results = [SessionResult.model_validate(r) for r in body["results"]]
    assert len(results) == 4
    assert {r.node_id for r in results} == {"a", "b"}
    assert len({r.session_id for r in results}) == 4
    for r in results:
        assert r.status == SessionStatus.COMPLETED, r.error
        assert r.reward == 1.0 and r.passed  # hello.txt really exists
        assert {"queued", "init", "ready_wait", "run", "postrun", "total"} <= set(r.timing)
        trajectory = r.trajectory
        assert trajectory is not None and trajectory.status == "COMPLETED"
        assert trajectory.metadata["group_id"] == "hello"
        assert trajectory.metadata["rollout_step"] == 3
        assert trajectory.metadata["session_id"] == r.session_id
        [trace] = trajectory.traces  # two calls merged into one trace
        assert trace.metadata["num_calls"] == 2
        assert 0 in trace.loss_mask and trace.loss_mask[0] == 1 and trace.loss_mask[-1] == 1
        assert trace.response_logprobs is not None and trace.reward == 1.0
        node = cluster.nodes[r.node_id]
        records = node.store.records(r.session_id)
        assert len(records) == 2
        sampled = [t for rec in records for t in rec.sampled_ids]
        trainable = [t for t, m in zip(trace.response_ids, trace.loss_mask, strict=True) if m]
        assert trainable == sampled  # exactly the engine's sampled tokens
        # The session's key stops working once its harness is done.
        gone = httpx.post(
            f"{node.url}/s/{r.session_id}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert gone.status_code == 401

    result_file = Path(body["result_paths"][0])
    assert len(result_file.read_text().splitlines()) == 4

    time.sleep(0.5)  # let any stray duplicate arrive before counting
    keys = [c["key"] for c in cluster.receiver.received]
    assert sorted(keys) == sorted(r.session_id for r in results)
    assert all(
        c["session_id"] == c["key"] == c["body"]["session_id"] for c in cluster.receiver.received
    )


def test_api_listing_status_events_and_auth(cluster: Cluster) -> None:
    headers = cluster.headers()
    assert httpx.get(f"{cluster.url}/tasks").status_code == 401
    assert httpx.get(f"{cluster.url}/health").status_code == 200
    cluster.submit(shell_task("listing", cluster.receiver, num_samples=2))
    cluster.wait_task("listing")
    tasks = httpx.get(f"{cluster.url}/tasks", headers=headers).json()
    assert [(t["task_id"], t["counts"]) for t in tasks] == [("listing", {"COMPLETED": 2})]
    sessions = httpx.get(f"{cluster.url}/tasks/listing/sessions", headers=headers).json()
    assert [s["status"] for s in sessions] == ["COMPLETED", "COMPLETED"]
    assert all(s["callback"] in ("delivered", "pending") for s in sessions)
    status = httpx.get(f"{cluster.url}/status", headers=headers).json()
    assert {n["node_id"] for n in status["nodes"]} == {"a", "b"}
    assert status["sessions"] == {"COMPLETED": 2}

    kinds = []
    with httpx.stream(
        "GET", f"{cluster.url}/events", params={"task_id": "listing"}, headers=headers, timeout=10
    ) as stream:
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kinds.append(line.removeprefix("event: "))
            if kinds and kinds[-1] == "task_completed":
                break
    assert kinds[0] == "task_submitted"
    assert kinds.count("session_dispatched") == 2 and kinds.count("session_finished") == 2

    node = cluster.nodes["a"]
    assert httpx.get(f"{node.url}/polar/node/status").status_code == 401
    node_status = httpx.get(f"{node.url}/polar/node/status", headers=headers).json()
    assert node_status["node_id"] == "a" and node_status["workers"]["run"] == 2
