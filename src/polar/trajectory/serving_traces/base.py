"""What every serving-trace format shares: a capture store read session by session, and the
small interface a format implements.

The store is opened read-only (a live gateway may keep writing) and every record is decoded
with the same checks as ``polar capture verify``: a record that does not decode exactly stops
the export naming it, so a trace never silently lacks a call.
"""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import orjson
from pydantic import BaseModel, ConfigDict

from polar.capture.records import CaptureRecord
from polar.capture.rows import RowDecoder
from polar.trajectory.base import side_call_kind
from polar.trajectory.lineage import SessionTree, learn_eot, session_tree


class StoredSession(BaseModel):
    """What a gateway node registered about a session in the store (its task and sample)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    task_id: str | None = None
    sample_index: int | None = None


@dataclass(frozen=True)
class CapturedSession:
    """One session's calls in call order, what the store knows of it, and its agent tree."""

    session_id: str
    stored: StoredSession
    records: list[CaptureRecord]
    tree: SessionTree = field(repr=False)


def read_sessions(
    path: str | Path, session_ids: Collection[str] | None = None
) -> Iterator[CapturedSession]:
    """The store's sessions (all, or ``session_ids``) in creation order, each decoded whole;
    raises FileNotFoundError without a store and CorruptRecord on a record that fails."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no capture store at {path}")
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row

    def fetch(completion_id: str) -> sqlite3.Row | None:
        row: sqlite3.Row | None = conn.execute(
            "SELECT * FROM completions WHERE completion_id = ?", (completion_id,)
        ).fetchone()
        return row

    try:
        metadata = {
            r["session_id"]: orjson.loads(r["metadata"])
            for r in conn.execute("SELECT session_id, metadata FROM sessions ORDER BY created_at")
        }
        order = list(metadata)
        order += [
            r[0]
            for r in conn.execute("SELECT DISTINCT session_id FROM completions")
            if r[0] not in metadata
        ]
        decoder = RowDecoder(fetch)
        for session_id in order:
            if session_ids is not None and session_id not in session_ids:
                continue
            rows = conn.execute(
                "SELECT * FROM completions WHERE session_id = ? ORDER BY seq", (session_id,)
            ).fetchall()
            records = [decoder.record(row) for row in rows]
            if not records:
                continue
            agent = [r for r in records if side_call_kind(r) is None]
            yield CapturedSession(
                session_id,
                StoredSession.model_validate(metadata.get(session_id, {})),
                records,
                session_tree(agent, learn_eot(agent)),
            )
    finally:
        conn.close()


class ServingTrace(ABC):
    """One format: sessions in, JSON rows out (one JSONL line each)."""

    name: ClassVar[str]

    def __init__(self, *, block_size: int = 512) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, not {block_size}")
        self.block_size = block_size

    @abstractmethod
    def rows(self, sessions: Iterator[CapturedSession], origin: float) -> Iterator[dict[str, Any]]:
        """The format's rows for ``sessions``; ``origin`` is the first call's start (epoch
        seconds), where a trace's clock starts. An exporter may keep state across sessions."""


def first_call_at(path: str | Path, session_ids: Collection[str] | None = None) -> float:
    """When the earliest call of the store (or of ``session_ids``) started; 0 without calls."""
    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT session_id, MIN(started_at) FROM completions GROUP BY 1")
        starts = [t for sid, t in rows if session_ids is None or sid in session_ids]
    finally:
        conn.close()
    return min(starts, default=0.0)


def ms(seconds: float) -> int:
    """Seconds as whole milliseconds (the unit both formats use for times)."""
    return round(seconds * 1000)


def observation_length(previous: CaptureRecord, record: CaptureRecord) -> int:
    """Tokens of ``record``'s prompt that the previous call's context did not hold: its prompt
    and its sampled reply. For a call extending the previous one (the re-rendered reply equal
    to the sampled ids) these are exactly the harness's tool results and user text plus the
    template's glue; for a rewritten or other agent's prompt, the suffix after the shared part."""
    context = [*previous.prompt_ids, *previous.sampled_ids]
    prompt = record.prompt_ids
    shared = 0
    for a, b in zip(context, prompt, strict=False):
        if a != b:
            break
        shared += 1
    return len(prompt) - shared
