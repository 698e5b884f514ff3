"""Durable rollout state: tasks and sessions in SQLite, results appended to JSONL per task.

A restarted rollout server reopens this store and still answers for finished tasks, resumes
dispatching sessions no node has acknowledged, and resumes callbacks not yet delivered. A
session's result is final once written: a second result for it (a retried delivery, a node that
came back after its grace period) is recognised and ignored.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from polar.errors import TaskConflict
from polar.schemas.ids import path_segment
from polar.schemas.rollout import CallbackState
from polar.schemas.task import SessionResult, SessionStatus, TaskRequest, TaskStatus
from polar.schemas.token_delivery import TokenDelivery, settle

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    request BLOB NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    finished_at REAL
);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    sample_index INTEGER NOT NULL,
    status TEXT NOT NULL,
    node_id TEXT,
    acknowledged INTEGER NOT NULL DEFAULT 0,
    result BLOB,
    callback TEXT NOT NULL DEFAULT 'none',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_task ON sessions (task_id, sample_index);
CREATE INDEX IF NOT EXISTS sessions_by_node ON sessions (node_id, status);
CREATE TABLE IF NOT EXISTS node_credentials (
    node_id TEXT PRIMARY KEY,
    digest TEXT NOT NULL,
    issued_at REAL NOT NULL
);
"""

_FINAL = tuple(s.value for s in SessionStatus if s.finished)


@dataclass(frozen=True)
class TaskRow:
    task_id: str
    request: TaskRequest
    status: TaskStatus
    created_at: float
    finished_at: float | None


@dataclass(frozen=True)
class SessionRow:
    session_id: str
    task_id: str
    sample_index: int
    status: SessionStatus
    node_id: str | None
    acknowledged: bool
    result: SessionResult | None
    callback: CallbackState


@dataclass(frozen=True)
class SessionState:
    """Where a session is, without its result."""

    session_id: str
    sample_index: int
    status: SessionStatus
    node_id: str | None


@dataclass(frozen=True)
class Headline:
    """A final result's reward, error and duration: what a page lists of it."""

    reward: float | None
    error: str | None
    seconds: float | None
    delivery: TokenDelivery | None = None
    """The session's delivery, settled by its outcome (None: not counted)."""


@dataclass(frozen=True)
class Finished:
    """What recording a final result changed."""

    new: bool
    task_completed: bool
    callback_url: str | None


class RolloutStore:
    """Thread-safe (one lock): the server calls it from worker threads to keep its loop free."""

    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir)
        self.results_dir = self.data_dir / "results"
        self.results_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            str(self.data_dir / "rollout.db"), check_same_thread=False, isolation_level=None
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- tasks ---------------------------------------------------------------------------

    def create_task(self, request: TaskRequest, session_ids: list[str]) -> bool:
        """Record a task and its sessions; False (nothing changed) if the same request already
        has this id, running or finished. Raises :class:`TaskConflict` if a different one has."""
        now = time.time()
        with self._lock:
            row = self._db.execute(
                "SELECT request, status FROM tasks WHERE task_id = ?", (request.task_id,)
            ).fetchone()
            if row is not None:
                existing = TaskRequest.model_validate_json(row[0])
                if existing.model_dump(mode="json") == request.model_dump(mode="json"):
                    return False
                raise TaskConflict(request.task_id, TaskStatus(row[1]))
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "INSERT INTO tasks VALUES (?, ?, ?, ?, NULL)",
                (
                    request.task_id,
                    request.model_dump_json().encode(),
                    TaskStatus.RUNNING.value,
                    now,
                ),
            )
            self._db.executemany(
                "INSERT INTO sessions (session_id, task_id, sample_index, status, created_at,"
                " updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (sid, request.task_id, i, SessionStatus.REGISTERED.value, now, now)
                    for i, sid in enumerate(session_ids)
                ],
            )
            self._db.execute("COMMIT")
        return True

    def task(self, task_id: str) -> TaskRow | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        return _task_row(row) if row else None

    def tasks(self) -> list[TaskRow]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM tasks ORDER BY created_at").fetchall()
        return [_task_row(r) for r in rows]

    def latest_tasks(self, limit: int) -> list[TaskRow]:
        """Running tasks first, then the most recent: at most ``limit``."""
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM tasks ORDER BY status = ? DESC, created_at DESC LIMIT ?",
                (TaskStatus.RUNNING.value, limit),
            ).fetchall()
        return [_task_row(r) for r in rows]

    def task_counts(self) -> dict[str, int]:
        """Tasks per status."""
        with self._lock:
            rows = self._db.execute("SELECT status, COUNT(*) FROM tasks GROUP BY status")
            return {status: n for status, n in rows.fetchall()}

    def results_path(self, task_id: str) -> Path:
        """``results/<task>.jsonl`` (:class:`~polar.schemas.ids.InvalidId` for a task id that
        does not follow the id grammar)."""
        return self.results_dir / f"{path_segment(task_id)}.jsonl"

    def answer_path(self, task_id: str) -> Path:
        """Where a COMPLETED task's whole ``GET /tasks/{id}`` answer is kept once built."""
        return self.results_path(task_id).with_suffix(".task.json")

    # -- sessions ------------------------------------------------------------------------

    def sessions(self, task_id: str) -> list[SessionRow]:
        return self._sessions("WHERE task_id = ? ORDER BY sample_index", (task_id,))

    def session_states(self, task_id: str) -> list[SessionState]:
        """The task's sessions in sample order, without reading a result."""
        with self._lock:
            rows = self._db.execute(
                "SELECT session_id, sample_index, status, node_id FROM sessions"
                " WHERE task_id = ? ORDER BY sample_index",
                (task_id,),
            ).fetchall()
        return [SessionState(r[0], r[1], SessionStatus(r[2]), r[3]) for r in rows]

    def headlines(self, session_ids: list[str]) -> dict[str, Headline]:
        """The headlines of those of ``session_ids`` with a result, read out of the stored
        results by SQLite (no trajectory is parsed in Python)."""
        found: dict[str, Headline] = {}
        for start in range(0, len(session_ids), 500):
            chunk = session_ids[start : start + 500]
            with self._lock:
                rows = self._db.execute(
                    "SELECT session_id, json_extract(r, '$.reward'), json_extract(r, '$.error'),"
                    " json_extract(r, '$.timing.total'), json_extract(r, '$.status'),"
                    " json_extract(r, '$.trajectory.metadata.delivery'),"
                    " json_extract(r, '$.failure.kind') FROM (SELECT session_id,"
                    " CAST(result AS TEXT) AS r FROM sessions WHERE result IS NOT NULL"
                    f" AND session_id IN ({','.join('?' * len(chunk))}))",
                    chunk,
                ).fetchall()
            for sid, reward, error, seconds, status, built, kind in rows:
                counted = TokenDelivery.model_validate_json(built) if built else None
                found[sid] = Headline(
                    reward=float(reward) if reward is not None else None,
                    error=error,
                    seconds=float(seconds) if seconds is not None else None,
                    delivery=settle(counted, status, kind) if counted else None,
                )
        return found

    def result_blobs(self, task_id: str) -> list[bytes]:
        """The task's final results as stored (SessionResult JSON), in sample order: what
        ``GET /tasks/{id}`` sends without parsing a single trajectory."""
        with self._lock:
            rows = self._db.execute(
                "SELECT result FROM sessions WHERE task_id = ? AND result IS NOT NULL"
                " ORDER BY sample_index",
                (task_id,),
            ).fetchall()
        return [bytes(r[0]) for r in rows]

    def session(self, session_id: str) -> SessionRow | None:
        rows = self._sessions("WHERE session_id = ?", (session_id,))
        return rows[0] if rows else None

    def unassigned(self, limit: int) -> list[SessionRow]:
        """Sessions waiting for a node, oldest task first."""
        return self._sessions(
            "WHERE node_id IS NULL AND status = ? ORDER BY created_at, task_id, sample_index"
            " LIMIT ?",
            (SessionStatus.REGISTERED.value, limit),
        )

    def unacknowledged(self) -> list[SessionRow]:
        """Sessions sent (or about to be) to a node that has not confirmed it has them."""
        return self._sessions(
            f"WHERE node_id IS NOT NULL AND acknowledged = 0 AND status NOT IN {_FINAL}", ()
        )

    def unfinished_on(self, node_id: str) -> list[SessionRow]:
        return self._sessions(f"WHERE node_id = ? AND status NOT IN {_FINAL}", (node_id,))

    def nodes_owing_results(self) -> list[str]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT DISTINCT node_id FROM sessions WHERE node_id IS NOT NULL"
                f" AND status NOT IN {_FINAL}"
            ).fetchall()
        return [r[0] for r in rows]

    def pending_callbacks(self) -> list[SessionRow]:
        return self._sessions("WHERE callback = ?", (CallbackState.PENDING.value,))

    def counts(self, task_id: str | None = None) -> dict[str, int]:
        """Sessions per status, of one task or of all."""
        where, params = ("WHERE task_id = ?", (task_id,)) if task_id is not None else ("", ())
        with self._lock:
            rows = self._db.execute(
                f"SELECT status, COUNT(*) FROM sessions {where} GROUP BY status", params
            )
            return {status: n for status, n in rows.fetchall()}

    def bindings(self, session_ids: list[str]) -> dict[str, tuple[str | None, SessionStatus]]:
        """session id -> (node it is bound to, status), for those of ``session_ids`` known."""
        found: dict[str, tuple[str | None, SessionStatus]] = {}
        with self._lock:
            for start in range(0, len(session_ids), 500):
                chunk = session_ids[start : start + 500]
                rows = self._db.execute(
                    "SELECT session_id, node_id, status FROM sessions WHERE session_id IN"
                    f" ({','.join('?' * len(chunk))})",
                    chunk,
                )
                found.update({sid: (node, SessionStatus(st)) for sid, node, st in rows})
        return found

    # -- node credentials ----------------------------------------------------------------

    def node_credentials(self) -> dict[str, str]:
        """node id -> digest of the credential it was issued."""
        with self._lock:
            rows = self._db.execute("SELECT node_id, digest FROM node_credentials").fetchall()
        return {node_id: digest for node_id, digest in rows}

    def set_node_credential(self, node_id: str, digest: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO node_credentials VALUES (?, ?, ?)",
                (node_id, digest, time.time()),
            )

    def delete_node_credential(self, node_id: str) -> bool:
        """Forget ``node_id``'s credential (the id may enrol anew); False if it had none."""
        with self._lock:
            cursor = self._db.execute("DELETE FROM node_credentials WHERE node_id = ?", (node_id,))
        return cursor.rowcount > 0

    def assign(self, session_id: str, node_id: str) -> bool:
        """Bind a waiting session to a node; False if it finished meanwhile (cancelled)."""
        return self._update("node_id = ?, acknowledged = 0", (node_id,), session_id)

    def unassign(self, session_id: str) -> None:
        """The node refused the session (full or draining): it goes back to the queue."""
        self._update("node_id = NULL, acknowledged = 0", (), session_id)

    def acknowledge(self, session_id: str, status: SessionStatus) -> None:
        self.set_status(session_id, status, acknowledged=True)

    def set_status(
        self, session_id: str, status: SessionStatus, *, acknowledged: bool = False
    ) -> None:
        """Progress reported by a node; never moves a finished session."""
        if status.finished:
            return
        sets = "status = ?" + (", acknowledged = 1" if acknowledged else "")
        self._update(sets, (status.value,), session_id)

    def finish(self, result: SessionResult) -> Finished:
        """Record a final result once; later ones for the same session are ignored."""
        now = time.time()
        with self._lock:
            row = self._db.execute(
                "SELECT s.status, t.request FROM sessions s JOIN tasks t USING (task_id)"
                " WHERE s.session_id = ?",
                (result.session_id,),
            ).fetchone()
            if row is None:
                raise KeyError(result.session_id)
            if row[0] in _FINAL:
                return Finished(new=False, task_completed=False, callback_url=None)
            request = TaskRequest.model_validate_json(row[1])
            callback = (
                CallbackState.PENDING.value if request.callback_url else CallbackState.NONE.value
            )
            payload = result.model_dump_json().encode()
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "UPDATE sessions SET status = ?, result = ?, callback = ?, node_id ="
                " COALESCE(?, node_id), acknowledged = 1, updated_at = ? WHERE session_id = ?",
                (result.status.value, payload, callback, result.node_id, now, result.session_id),
            )
            left = self._db.execute(
                f"SELECT COUNT(*) FROM sessions WHERE task_id = ? AND status NOT IN {_FINAL}",
                (request.task_id,),
            ).fetchone()[0]
            if left == 0:
                self._db.execute(
                    "UPDATE tasks SET status = ?, finished_at = ? WHERE task_id = ?",
                    (TaskStatus.COMPLETED.value, now, request.task_id),
                )
            with self.results_path(request.task_id).open("ab") as out:
                out.write(payload + b"\n")
            self._db.execute("COMMIT")
        return Finished(new=True, task_completed=left == 0, callback_url=request.callback_url)

    def set_callback(self, session_id: str, state: CallbackState) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE sessions SET callback = ? WHERE session_id = ?", (state.value, session_id)
            )

    # -- internals -----------------------------------------------------------------------

    def _update(self, sets: str, params: tuple[object, ...], session_id: str) -> bool:
        """Change an unfinished session (True); a finished one is never moved again (False)."""
        with self._lock:
            cursor = self._db.execute(
                f"UPDATE sessions SET {sets}, updated_at = ?"
                f" WHERE session_id = ? AND status NOT IN {_FINAL}",
                (*params, time.time(), session_id),
            )
            return cursor.rowcount > 0

    def _sessions(self, where: str, params: tuple[object, ...]) -> list[SessionRow]:
        with self._lock:
            rows = self._db.execute(
                "SELECT session_id, task_id, sample_index, status, node_id, acknowledged, result,"
                f" callback FROM sessions {where}",
                params,
            ).fetchall()
        return [
            SessionRow(
                session_id=r[0],
                task_id=r[1],
                sample_index=r[2],
                status=SessionStatus(r[3]),
                node_id=r[4],
                acknowledged=bool(r[5]),
                result=SessionResult.model_validate_json(r[6]) if r[6] else None,
                callback=CallbackState(r[7]),
            )
            for r in rows
        ]


def _task_row(row: tuple[object, ...]) -> TaskRow:
    return TaskRow(
        task_id=str(row[0]),
        request=TaskRequest.model_validate_json(row[1]),  # type: ignore[arg-type]
        status=TaskStatus(str(row[2])),
        created_at=float(row[3]),  # type: ignore[arg-type]
        finished_at=float(row[4]) if row[4] is not None else None,  # type: ignore[arg-type]
    )
