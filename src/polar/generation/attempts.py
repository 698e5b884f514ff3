"""The ledger of finished attempts, ``attempts.jsonl``: what makes ``polar generate`` resumable.

One line per finished attempt, appended and fsynced the moment its session result arrives, so
a run killed at any point keeps every attempt that finished before it. A rerun reads the
ledger and submits only the attempts it lacks. When an attempt was run again
(``--retry-errors``), its latest line is the one that counts.

Each attempt's full session result (trajectory, evaluation) is stored beside the ledger,
written before its line, so the dataset can always be rebuilt from the ledger alone.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from polar.schemas.task import SessionResult, SessionStatus
from polar.schemas.token_delivery import TokenDelivery
from polar.schemas.trajectory import TrajectoryStatus

LEDGER = "attempts.jsonl"
RESULTS_DIR = "trajectories"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_SLUG_LENGTH = 96


class AttemptRecord(BaseModel):
    """One finished attempt: how it ended, what it cost, and whether it was accepted."""

    model_config = ConfigDict(extra="forbid")

    instance_id: str
    attempt: int
    repo: str
    status: SessionStatus
    accepted: bool
    passed: bool
    resolved: bool | None = None
    reward: float | None = None
    prompt_tokens: int = 0
    sampled_tokens: int = 0
    calls: int = 0
    wall_s: float = 0.0
    session_id: str
    task_id: str
    run: int
    result: str
    """The stored session result, relative to the output directory."""
    error: str | None = None
    finished_at: float = 0.0
    delivery: TokenDelivery | None = None
    """The session's sampled tokens, delivered to trainable traces or lost by reason (None on
    lines written before it was counted)."""

    @property
    def key(self) -> tuple[str, int]:
        return (self.instance_id, self.attempt)

    @property
    def errored(self) -> bool:
        """Ended in ERROR: the runtime, harness or evaluator failed, not the model's attempt
        (a TIMEOUT is the model's, and counts as a finished, rejected attempt)."""
        return self.status == SessionStatus.ERROR


@dataclass(frozen=True)
class Spend:
    """What an attempt cost the engine, from the gateway's captured calls."""

    calls: int = 0
    prompt_tokens: int = 0
    sampled_tokens: int = 0


def attempt_record(
    result: SessionResult,
    *,
    instance_id: str,
    attempt: int,
    repo: str,
    run: int,
    stored: str,
    spend: Spend,
) -> AttemptRecord:
    """The ledger line for a finished session."""
    resolved = result.evaluation.details.get("resolved") if result.evaluation else None
    return AttemptRecord(
        instance_id=instance_id,
        attempt=attempt,
        repo=repo,
        status=result.status,
        accepted=accepted(result),
        passed=result.passed,
        resolved=resolved if isinstance(resolved, bool) else None,
        reward=result.reward,
        prompt_tokens=spend.prompt_tokens,
        sampled_tokens=spend.sampled_tokens,
        calls=spend.calls,
        wall_s=round(float(result.timing.get("total", 0.0)), 3),
        session_id=result.session_id,
        task_id=result.task_id,
        run=run,
        result=stored,
        error=result.error,
        finished_at=round(time.time(), 3),
        delivery=result.delivery,
    )


def accepted(result: SessionResult) -> bool:
    """Accepted for the dataset: the session and its trajectory completed, and the evaluator
    passed it (for ``swe_tests``: resolved)."""
    return (
        result.status == SessionStatus.COMPLETED
        and result.trajectory is not None
        and result.trajectory.status == TrajectoryStatus.COMPLETED
        and bool(result.trajectory.traces)
        and result.passed
    )


def instance_slug(instance_id: str) -> str:
    """``instance_id`` as an id-grammar word (task ids, file names); a hash suffix keeps two
    ids that differ only in unsafe characters apart."""
    slug = _UNSAFE.sub("_", instance_id)
    if slug == instance_id and len(slug) <= _SLUG_LENGTH and slug[:1].isalnum():
        return slug
    digest = hashlib.sha256(instance_id.encode()).hexdigest()[:8]
    return f"{slug.lstrip('_-')[: _SLUG_LENGTH - 9] or 'i'}-{digest}"


def result_path(instance_id: str, attempt: int) -> str:
    """Where an attempt's session result is stored, relative to the output directory."""
    return f"{RESULTS_DIR}/{instance_slug(instance_id)}/{attempt}.json"


def read_ledger(path: Path) -> dict[tuple[str, int], AttemptRecord]:
    """The latest record of each attempt. A line that does not parse (the torn last line of a
    killed run) is skipped: its attempt simply runs again."""
    records: dict[tuple[str, int], AttemptRecord] = {}
    if not path.is_file():
        return records
    with path.open("rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = AttemptRecord.model_validate_json(line)
            except ValidationError:
                continue
            records[record.key] = record
    return records


def missing_attempts(
    instance_ids: Sequence[str],
    attempts: int,
    done: dict[tuple[str, int], AttemptRecord],
    *,
    retry_errors: bool = False,
) -> dict[str, list[int]]:
    """Attempt indices ``0..attempts-1`` of each instance still to run, in order; with
    ``retry_errors``, attempts whose latest record ERRORed run again."""
    todo: dict[str, list[int]] = {}
    for instance_id in instance_ids:
        indices = [
            i
            for i in range(attempts)
            if (record := done.get((instance_id, i))) is None or (retry_errors and record.errored)
        ]
        if indices:
            todo[instance_id] = indices
    return todo


class Ledger:
    """Appends records durably: each line is flushed and fsynced before :meth:`append`
    returns."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.path = out_dir / LEDGER

    def store_result(self, instance_id: str, attempt: int, result: SessionResult) -> str:
        """Write the attempt's session result (atomically); returns its relative path."""
        relative = result_path(instance_id, attempt)
        write_atomic(self.out_dir / relative, result.model_dump_json().encode())
        return relative

    def append(self, record: AttemptRecord) -> None:
        line = record.model_dump_json().encode() + b"\n"
        with self.path.open("ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def load_result(self, record: AttemptRecord) -> SessionResult:
        return SessionResult.model_validate_json((self.out_dir / record.result).read_bytes())


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` all at once: a reader (or a crash) never sees half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def ordered(records: Iterable[AttemptRecord]) -> list[AttemptRecord]:
    """Records in a stable order, whatever order they finished in: by instance, attempt."""
    return sorted(records, key=lambda r: r.key)
