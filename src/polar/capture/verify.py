"""Verify a capture store: every record decodes exactly, every prefix chain and count holds.

:func:`verify_store` opens the database read-only (a live gateway may keep writing), runs
SQLite's own ``quick_check``, then decodes every record of every session in call order with the
same checks readers apply (:mod:`polar.capture.rows`): the prompt rebuilt along its chain of
bases (each base an earlier call of the same session) has the length the row recorded, token
blobs are whole and agree with their counts, bodies decompress and validate. It also finds
calls of one session sharing a sequence number. ``polar capture verify DB`` prints the report.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from polar.capture.rows import RowDecoder
from polar.capture.store import RecordFault, decode_or_fault


@dataclass
class SessionVerdict:
    """One session's records: how many, and each row that failed a check."""

    session_id: str
    records: int = 0
    faults: list[RecordFault] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.faults


@dataclass
class VerifyReport:
    path: Path
    integrity: list[str]  # what SQLite's quick_check found ("ok" is left out)
    sessions: list[SessionVerdict]

    @property
    def records(self) -> int:
        return sum(s.records for s in self.sessions)

    @property
    def faults(self) -> int:
        return len(self.integrity) + sum(len(s.faults) for s in self.sessions)

    @property
    def ok(self) -> bool:
        return self.faults == 0


def verify_store(path: str | Path) -> VerifyReport:
    """Check every record of the store at ``path``; raises FileNotFoundError if there is none."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no capture store at {path}")
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        integrity = [r[0] for r in conn.execute("PRAGMA quick_check") if r[0] != "ok"]
        session_ids = [
            r[0]
            for r in conn.execute(
                "SELECT session_id FROM sessions UNION SELECT session_id FROM completions"
            )
        ]
        sessions = [_verify_session(conn, sid) for sid in session_ids]
    finally:
        conn.close()
    return VerifyReport(path=path, integrity=integrity, sessions=sessions)


def _verify_session(conn: sqlite3.Connection, session_id: str) -> SessionVerdict:
    def fetch(completion_id: str) -> sqlite3.Row | None:
        return conn.execute(
            "SELECT * FROM completions WHERE completion_id = ?", (completion_id,)
        ).fetchone()

    decoder = RowDecoder(fetch)
    verdict = SessionVerdict(session_id)
    seen: set[int] = set()
    rows = conn.execute(
        "SELECT * FROM completions WHERE session_id = ? ORDER BY seq", (session_id,)
    )
    for row in rows:
        verdict.records += 1
        item = decode_or_fault(decoder, row)
        if isinstance(item, RecordFault):
            verdict.faults.append(item)
        elif row["seq"] in seen:
            verdict.faults.append(
                RecordFault(
                    row["completion_id"], session_id, row["seq"], "another call has this seq"
                )
            )
        seen.add(row["seq"])
    return verdict
