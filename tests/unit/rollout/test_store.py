"""Rollout state in SQLite + JSONL: conflicts, first-result-wins, completion, restart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar.rollout.store import RolloutStore, TaskConflict
from polar.schemas.ids import InvalidId
from polar.schemas.rollout import CallbackState
from polar.schemas.task import SessionResult, SessionStatus, TaskRequest, TaskStatus


def task(task_id: str = "t1", n: int = 2, callback: str | None = None) -> TaskRequest:
    return TaskRequest(task_id=task_id, instruction="x", num_samples=n, callback_url=callback)


def result(
    sid: str,
    task_id: str = "t1",
    status: SessionStatus = SessionStatus.COMPLETED,
    reward: float | None = 1.0,
) -> SessionResult:
    return SessionResult(
        session_id=sid, task_id=task_id, status=status, reward=reward, node_id="n1"
    )


@pytest.fixture
def store(tmp_path: Path) -> RolloutStore:
    s = RolloutStore(tmp_path)
    yield s
    s.close()


def test_a_task_id_is_never_replaced_the_same_request_again_changes_nothing(
    store: RolloutStore,
) -> None:
    assert store.create_task(task(), ["s1", "s2"])
    assert not store.create_task(task(), ["s3", "s4"])  # a retry: the running task stands
    with pytest.raises(TaskConflict, match=r"'t1' already exists \(RUNNING\)"):
        store.create_task(task(n=1), ["s5"])
    store.finish(result("s1"))
    store.finish(result("s2"))
    assert store.task("t1").status == TaskStatus.COMPLETED  # type: ignore[union-attr]
    assert not store.create_task(task(), ["s7", "s8"])  # finished: still not replaced
    with pytest.raises(TaskConflict, match=r"\(COMPLETED\) with a different request"):
        store.create_task(task(callback="http://cb"), ["s9"])
    assert [s.session_id for s in store.sessions("t1")] == ["s1", "s2"]
    assert store.task("t1").status == TaskStatus.COMPLETED  # type: ignore[union-attr]
    assert len(store.results_path("t1").read_text().splitlines()) == 2


def test_first_final_result_wins_and_completes_the_task(store: RolloutStore) -> None:
    store.create_task(task(callback="http://cb"), ["s1", "s2"])
    first = store.finish(result("s1", reward=0.5))
    assert first.new and not first.task_completed and first.callback_url == "http://cb"
    again = store.finish(result("s1", status=SessionStatus.ERROR, reward=None))
    assert not again.new
    assert store.session("s1").result.reward == 0.5  # type: ignore[union-attr]
    assert store.finish(result("s2")).task_completed
    lines = store.results_path("t1").read_text().splitlines()
    assert [json.loads(line)["session_id"] for line in lines] == ["s1", "s2"]
    with pytest.raises(KeyError):
        store.finish(result("nope"))


def test_progress_never_moves_a_finished_session(store: RolloutStore) -> None:
    store.create_task(task(), ["s1", "s2"])
    store.assign("s1", "n1")
    store.acknowledge("s1", SessionStatus.RUNNING)
    store.finish(result("s1"))
    store.set_status("s1", SessionStatus.RUNNING)
    store.unassign("s1")
    row = store.session("s1")
    assert row is not None and row.status == SessionStatus.COMPLETED and row.node_id == "n1"


def test_dispatch_queues(store: RolloutStore) -> None:
    store.create_task(task(n=3), ["s1", "s2", "s3"])
    assert [r.session_id for r in store.unassigned(10)] == ["s1", "s2", "s3"]
    store.assign("s1", "n1")
    store.assign("s2", "n2")
    store.acknowledge("s2", SessionStatus.INITIALIZING)
    assert [r.session_id for r in store.unassigned(10)] == ["s3"]
    assert [r.session_id for r in store.unacknowledged()] == ["s1"]
    assert sorted(store.nodes_owing_results()) == ["n1", "n2"]
    assert [r.session_id for r in store.unfinished_on("n2")] == ["s2"]
    store.unassign("s1")
    assert [r.session_id for r in store.unassigned(1)] == ["s1"]


def test_callback_state(store: RolloutStore) -> None:
    store.create_task(task(callback="http://cb"), ["s1", "s2"])
    store.create_task(task("t2", n=1), ["x1"])
    store.finish(result("s1"))
    store.finish(result("x1", task_id="t2"))
    assert [r.session_id for r in store.pending_callbacks()] == ["s1"]
    assert store.session("x1").callback == CallbackState.NONE  # type: ignore[union-attr]
    store.set_callback("s1", CallbackState.DELIVERED)
    assert store.pending_callbacks() == []
    assert store.session("s1").callback == CallbackState.DELIVERED  # type: ignore[union-attr]


def test_state_survives_a_restart(tmp_path: Path) -> None:
    store = RolloutStore(tmp_path)
    store.create_task(task(n=1), ["s1"])
    store.finish(result("s1", reward=0.25))
    store.close()
    again = RolloutStore(tmp_path)
    try:
        row = again.task("t1")
        assert row is not None and row.status == TaskStatus.COMPLETED
        assert row.request.num_samples == 1
        assert again.sessions("t1")[0].result.reward == 0.25  # type: ignore[union-attr]
        assert again.counts() == {"COMPLETED": 1}
    finally:
        again.close()


def test_results_path_takes_only_ids_of_the_grammar(store: RolloutStore) -> None:
    assert store.results_path("task-1_a").name == "task-1_a.jsonl"
    for bad in ["../../etc/passwd", "a/b", "..", "", "task-1.a", "x" * 300]:
        with pytest.raises(InvalidId):
            store.results_path(bad)
