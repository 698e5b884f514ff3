"""The ledger: what is accepted, what a rerun still has to run, and how records survive."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from polar.generation.attempts import (
    AttemptRecord,
    Ledger,
    Spend,
    accepted,
    attempt_record,
    instance_slug,
    missing_attempts,
    read_ledger,
)
from polar.schemas.ids import is_valid_id
from polar.schemas.task import SessionStatus
from polar.schemas.trajectory import TrajectoryStatus

from .results import result


def record(
    instance_id: str, attempt: int, *, status: str = "COMPLETED", ok: bool = True
) -> AttemptRecord:
    return AttemptRecord(
        instance_id=instance_id,
        attempt=attempt,
        repo="o/r",
        status=SessionStatus(status),
        accepted=ok,
        passed=ok,
        session_id=f"s-{instance_id}-{attempt}",
        task_id="t",
        run=1,
        result=f"trajectories/{instance_id}/{attempt}.json",
    )


def test_accepted_needs_a_completed_trajectory_and_a_pass() -> None:
    assert accepted(result())
    assert not accepted(result(passed=False))
    assert not accepted(result(passed=None))
    assert not accepted(result(status=SessionStatus.TIMEOUT))
    assert not accepted(result(trajectory_status=TrajectoryStatus.ERROR))
    assert not accepted(result(traces=0))
    assert not accepted(result(status=SessionStatus.ERROR, error="runtime failed"))


def test_attempt_record_carries_outcome_spend_and_time() -> None:
    made = attempt_record(
        result(passed=True, session_id="ps-9", task_id="x-r2"),
        instance_id="o__r-1",
        attempt=3,
        repo="o/r",
        run=2,
        stored="trajectories/o__r-1/3.json",
        spend=Spend(calls=4, prompt_tokens=1000, sampled_tokens=80),
    )
    assert made.key == ("o__r-1", 3)
    assert (made.accepted, made.passed, made.resolved, made.reward) == (True, True, True, 1.0)
    assert (made.calls, made.prompt_tokens, made.sampled_tokens) == (4, 1000, 80)
    assert made.wall_s == 12.5
    assert (made.session_id, made.task_id, made.run) == ("ps-9", "x-r2", 2)


@pytest.mark.parametrize(
    "instance_id",
    ["django__django-11099", "owner__repo.abc123.func_pm_remove_assign__x", "-lead", "a" * 200],
)
def test_slugs_are_ids_and_short(instance_id: str) -> None:
    slug = instance_slug(instance_id)
    assert is_valid_id(slug) and len(slug) <= 96
    assert is_valid_id(f"{slug}-r123")


def test_slugs_keep_a_valid_id_and_tell_near_ids_apart() -> None:
    assert instance_slug("django__django-11099") == "django__django-11099"
    assert instance_slug("a.b") != instance_slug("a_b")
    assert instance_slug("a.b") == instance_slug("a.b")


def test_latest_line_wins_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ledger.append(record("i1", 0, status="ERROR", ok=False))
    ledger.append(record("i1", 1))
    ledger.append(record("i1", 0))
    with ledger.path.open("ab") as f:
        f.write(b'{"instance_id": "i2", "attempt": 0, "re')  # a run killed mid-write
    read = read_ledger(ledger.path)
    assert sorted(read) == [("i1", 0), ("i1", 1)]
    assert read[("i1", 0)].status == SessionStatus.COMPLETED
    assert read_ledger(tmp_path / "absent.jsonl") == {}


def test_each_append_is_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    ledger = Ledger(tmp_path)
    ledger.append(record("i1", 0))
    ledger.append(record("i1", 1))
    assert len(synced) == 2
    assert len(ledger.path.read_text().splitlines()) == 2


def test_missing_attempts() -> None:
    records = [
        record("a", 0),
        record("a", 2, status="ERROR", ok=False),
        record("b", 0, status="TIMEOUT", ok=False),
        record("b", 1),
    ]
    done = {r.key: r for r in records}
    assert missing_attempts(["a", "b", "c"], 3, done) == {"a": [1], "b": [2], "c": [0, 1, 2]}
    assert missing_attempts(["a", "b"], 3, done, retry_errors=True) == {"a": [1, 2], "b": [2]}
    assert missing_attempts(["a", "b"], 2, done) == {"a": [1]}
    assert missing_attempts(["b"], 2, done, retry_errors=True) == {}  # a timeout is final


def test_results_are_stored_and_read_back(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    stored = ledger.store_result("owner__repo.x", 2, result(seed=5))
    assert stored.startswith("trajectories/") and stored.endswith("/2.json")
    back = ledger.load_result(record("owner__repo.x", 2).model_copy(update={"result": stored}))
    assert back == result(seed=5)
    assert not list(tmp_path.rglob("*.tmp"))
