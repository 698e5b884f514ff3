"""The durable capture store: SQLite in WAL mode, one writer thread with group commit.

``append`` returns only after the record's transaction has committed, so a completion handed
back to a harness is already on disk. Batching commits in one writer thread keeps that
guarantee cheap under hundreds of concurrent sessions; reads use their own connection.

A failed write never touches another record: each record is validated and encoded before its
batch begins (a record that cannot be stored exactly fails alone, with :class:`CaptureError`);
a constraint violation inside the batch rolls back that record's statement only; the prefix
index and the per-session sequence numbers change only with rows that are in the database, and
are dropped whenever a batch rolls back. When the store itself cannot commit (disk full, the
write lock held past the busy timeout, an I/O error), every waiter of that batch gets
:class:`InsufficientStorage` (507) or :class:`CaptureUnavailable` (503) naming the cause, new
appends are refused at once, and one append every ``retry_after_s`` goes through as a probe:
the first that commits ends the fault, so call traffic alone recovers the store within
``retry_after_s`` of the fault clearing. Reads keep working throughout.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson
import zstandard

from polar.capture.records import CaptureRecord
from polar.capture.rows import BODY_FIELDS, RowDecoder, decompress_body
from polar.capture.token_blobs import PrefixIndex, exact_ids, logprobs_to_blob
from polar.errors import CaptureError, CaptureUnavailable, CorruptRecord, InsufficientStorage

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    metadata BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS completions (
    completion_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    finish_reason TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL NOT NULL,
    policy_version INTEGER,
    n_prompt INTEGER NOT NULL,
    n_sampled INTEGER NOT NULL,
    flags TEXT NOT NULL,
    tags TEXT NOT NULL,
    prompt_base TEXT,
    prompt_prefix_len INTEGER NOT NULL,
    prompt_suffix BLOB NOT NULL,
    sampled BLOB NOT NULL,
    logprobs BLOB,
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS completions_by_session ON completions (session_id, seq);
CREATE TABLE IF NOT EXISTS replies (
    reply_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    completion_id TEXT NOT NULL,
    body BLOB NOT NULL
);
"""

Synchronous = Literal["NORMAL", "FULL"]
_STOP = object()
_PAGE = 64  # rows read per query when streaming a session's records
# SQLite primary result codes (the low byte of an extended code) that mean the store, not the
# record, is at fault.
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_FULL = 5, 6, 13


@dataclass
class RecordFault:
    """A stored row that does not decode exactly (what readers report in its place)."""

    completion_id: str
    session_id: str
    seq: int
    error: str


@dataclass
class _Encoded:
    """A record's columns, computed before its batch so a bad record fails alone."""

    record: CaptureRecord
    prompt: np.ndarray
    sampled: bytes
    logprobs: bytes | None
    flags: str
    tags: str
    body: bytes


class CaptureStore:
    """Append-only store of :class:`CaptureRecord` plus the sessions they belong to.

    ``synchronous``: NORMAL (the default) survives a process crash at every acknowledged call;
    FULL also survives power loss (an fsync per commit). ``max_bytes`` caps the database: a
    full store refuses new calls like a full disk. ``busy_timeout_s`` is how long a commit waits
    for a write lock held by another connection before the store reports itself unavailable.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Synchronous = "NORMAL",
        batch_max: int = 256,
        busy_timeout_s: float = 10.0,
        max_bytes: int | None = None,
        retry_after_s: float = 1.0,
    ):
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.synchronous = synchronous
        self.max_bytes = max_bytes
        self.retry_after_s = retry_after_s
        self._busy_ms = int(busy_timeout_s * 1000)
        self._batch_max = batch_max
        self._queue: queue.Queue[Any] = queue.Queue()
        self._prefixes = PrefixIndex()
        self._compressor = zstandard.ZstdCompressor(level=1)  # the writer thread's alone
        self._seq: dict[str, int] = {}
        self._fault: CaptureUnavailable | None = None
        self._probe_at = 0.0
        self._read = self._connect()
        self._read.row_factory = sqlite3.Row
        self._read_lock = threading.Lock()
        self._writer = threading.Thread(target=self._write_loop, name="capture-writer", daemon=True)
        self._writer.start()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
        conn.executescript(_SCHEMA)
        return conn

    # -- writing -------------------------------------------------------------------------

    async def append(self, record: CaptureRecord, *, checked: bool = False) -> CaptureRecord:
        """Store ``record`` durably; returns it with its per-session ``seq`` assigned.

        ``checked``: the caller already passed :meth:`check_writable` for this record (the
        gateway does before the engine call), so the write goes straight to the writer: a call
        is refused at most once per check, and the check's probe really probes.

        Raises :class:`CaptureError` if this record cannot be stored exactly, and
        :class:`CaptureUnavailable` / :class:`InsufficientStorage` while the store cannot commit.
        """
        if not checked:
            self.check_writable()
        return await asyncio.wrap_future(self.submit(("record", record)))

    def check_writable(self) -> None:
        """Raises the store's fault while it has one, except once every ``retry_after_s``: that
        caller goes on and its write probes whether the fault has cleared (so it must reach the
        writer: pass ``checked=True`` to :meth:`append`)."""
        fault = self._fault
        if fault is None:
            return
        now = time.monotonic()
        if now < self._probe_at:
            raise type(fault)(fault.message, retry_after=fault.retry_after)
        self._probe_at = now + self.retry_after_s

    @property
    def fault(self) -> CaptureUnavailable | None:
        """Why the store refuses writes now, or None."""
        return self._fault

    @property
    def queue_depth(self) -> int:
        """Operations waiting for the writer thread (a gauge of how far behind it is)."""
        return self._queue.qsize()

    async def add_session(self, session_id: str, metadata: dict[str, Any]) -> None:
        await asyncio.wrap_future(self.submit(("session", session_id, metadata)))

    async def close_session(self, session_id: str) -> None:
        """Mark a session closed: its key must not come back to life when a gateway restarts."""
        await asyncio.wrap_future(self.submit(("close", session_id)))

    async def keep_reply(
        self, session_id: str, reply_id: str, completion_id: str, body: dict[str, Any]
    ) -> None:
        """Keep the reply a client may fetch again or continue (APIs with stored responses)."""
        await asyncio.wrap_future(self.submit(("reply", session_id, reply_id, completion_id, body)))

    async def forget_reply(self, session_id: str, reply_id: str) -> bool:
        """Drop a kept reply (its call's record stays); False if the session has none by that id."""
        return bool(await asyncio.wrap_future(self.submit(("forget", session_id, reply_id))))

    async def delete_session(self, session_id: str) -> None:
        """Drop a session's calls; its row stays, closed (a deleted id is never reopened)."""
        await asyncio.wrap_future(self.submit(("delete", session_id)))

    def submit(self, op: tuple[Any, ...]) -> Future[Any]:
        if not self._writer.is_alive():
            raise CaptureUnavailable("capture store is closed (its writer thread is not running)")
        future: Future[Any] = Future()
        self._queue.put((op, future))
        return future

    def close(self) -> None:
        if self._writer.is_alive():
            self._queue.put(_STOP)
            self._writer.join(timeout=30)
        with self._read_lock:
            self._read.close()

    def _write_loop(self) -> None:
        conn = self._connect()
        limit: int | None = None
        try:
            while True:
                batch = self._next_batch()
                if batch is None:
                    return
                if self.max_bytes != limit:
                    limit = self.max_bytes
                    _set_max_bytes(conn, limit)
                self._commit(conn, batch)
        finally:
            conn.close()

    def _next_batch(self) -> list[tuple[tuple[Any, ...], Future[Any]]] | None:
        """The next ops to commit together (None: stop), without those whose caller gave up
        (a cancelled append was never acknowledged to anyone, so it is not written)."""
        first = self._queue.get()
        if first is _STOP:
            return None
        batch = [first]
        while len(batch) < self._batch_max:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                self._queue.put(_STOP)
                break
            batch.append(item)
        return [(op, future) for op, future in batch if future.set_running_or_notify_cancel()]

    def _commit(self, conn: sqlite3.Connection, batch: list[tuple[Any, Future[Any]]]) -> None:
        ready: list[tuple[Any, Future[Any]]] = []
        for op, future in batch:
            try:
                ready.append((self._prepare(op), future))
            except (CaptureError, ValueError) as exc:  # this one alone cannot be stored
                future.set_exception(exc)
        if not ready:
            return
        done: list[tuple[Future[Any], Any]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for op, future in ready:
                try:
                    done.append((future, self._apply(conn, op)))
                except sqlite3.IntegrityError as exc:  # only this statement was rolled back
                    future.set_exception(CaptureError(f"completion not stored: {exc}"))
            conn.execute("COMMIT")
        except Exception as exc:  # nothing of this batch is stored; every waiter hears why
            self._rolled_back(conn)
            error = _store_error(exc, self._busy_ms) if isinstance(exc, sqlite3.Error) else None
            if error is not None:
                self._fault = error
                self._probe_at = time.monotonic() + self.retry_after_s
            for _, future in ready:
                if not future.done():  # a record that failed alone already knows why
                    future.set_exception(error or CaptureError(f"capture commit failed: {exc!r}"))
            return
        self._fault = None
        for future, result in done:
            future.set_result(result)

    def _rolled_back(self, conn: sqlite3.Connection) -> None:
        """After a failed batch: undo it, and forget what the caches learned from it."""
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # SQLite already rolled back (it does on some disk-full and I/O errors)
        self._prefixes.clear()
        self._seq.clear()

    def _prepare(self, op: tuple[Any, ...]) -> tuple[Any, ...]:
        """Everything about ``op`` that can fail without the database, done before the batch."""
        kind = op[0]
        if kind == "record":
            return ("record", self._encode(op[1]))
        if kind == "session":
            try:
                return ("session", op[1], orjson.dumps(op[2]))
            except orjson.JSONEncodeError as exc:
                raise CaptureError(f"session metadata cannot be stored: {exc}") from exc
        if kind == "reply":
            try:
                return ("reply", *op[1:4], self._compressor.compress(orjson.dumps(op[4])))
            except orjson.JSONEncodeError as exc:
                raise CaptureError(f"reply cannot be stored: {exc}") from exc
        if kind in ("close", "delete", "forget"):
            return op
        raise ValueError(f"unknown store operation {kind!r}")

    def _encode(self, record: CaptureRecord) -> _Encoded:
        n_sampled = len(record.sampled_ids)
        if record.logprobs is not None and len(record.logprobs) != n_sampled:
            raise CaptureError(
                f"completion not stored: {len(record.logprobs)} logprobs for "
                f"{n_sampled} sampled ids"
            )
        body = {name: getattr(record, name) for name in BODY_FIELDS}
        try:
            return _Encoded(
                record=record,
                prompt=exact_ids(record.prompt_ids, "prompt ids"),
                sampled=exact_ids(record.sampled_ids, "sampled ids").tobytes(),
                logprobs=logprobs_to_blob(record.logprobs),
                flags=orjson.dumps(record.flags).decode(),
                tags=orjson.dumps(record.tags).decode(),
                body=self._compressor.compress(orjson.dumps(body)),
            )
        except (ValueError, TypeError, orjson.JSONEncodeError) as exc:
            raise CaptureError(
                f"completion not stored, it cannot be stored exactly: {exc}"
            ) from exc

    def _apply(self, conn: sqlite3.Connection, op: tuple[Any, ...]) -> Any:
        kind = op[0]
        if kind == "record":
            return self._insert_record(conn, op[1])
        if kind == "session":
            conn.execute(
                "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?)", (op[1], time.time(), op[2])
            )
            return None
        if kind == "close":
            self._close(conn, op[1])
            return None
        if kind == "reply":
            conn.execute(
                "INSERT OR REPLACE INTO replies VALUES (?, ?, ?, ?)", (op[2], op[1], *op[3:])
            )
            return None
        if kind == "forget":
            cursor = conn.execute(
                "DELETE FROM replies WHERE reply_id = ? AND session_id = ?", (op[2], op[1])
            )
            return cursor.rowcount > 0
        # delete: the calls go; the session's row stays, closed, so its id is never reused
        conn.execute("DELETE FROM completions WHERE session_id = ?", (op[1],))
        conn.execute("DELETE FROM replies WHERE session_id = ?", (op[1],))
        self._close(conn, op[1])
        self._prefixes.forget(op[1])
        self._seq.pop(op[1], None)
        return None

    def _close(self, conn: sqlite3.Connection, session_id: str) -> None:
        row = conn.execute(
            "SELECT metadata FROM sessions WHERE session_id = ?", (session_id,)
        ).fetchone()
        if row is not None:
            metadata = orjson.loads(row[0]) | {"closed": True}
            conn.execute(
                "UPDATE sessions SET metadata = ? WHERE session_id = ?",
                (orjson.dumps(metadata), session_id),
            )

    def _insert_record(self, conn: sqlite3.Connection, enc: _Encoded) -> CaptureRecord:
        record = enc.record
        sid = record.session_id
        seq = self._seq.get(sid)
        if seq is None:
            row = conn.execute(
                "SELECT MAX(seq) FROM completions WHERE session_id = ?", (sid,)
            ).fetchone()
            seq = -1 if row[0] is None else int(row[0])
        ref = self._prefixes.choose(sid, enc.prompt)
        conn.execute(
            "INSERT INTO completions VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                record.completion_id,
                sid,
                seq + 1,
                record.provider,
                record.model,
                record.finish_reason,
                record.started_at,
                record.finished_at,
                record.policy_version,
                len(enc.prompt),
                len(record.sampled_ids),
                enc.flags,
                enc.tags,
                ref.base_id,
                ref.prefix_len,
                ref.suffix.tobytes(),
                enc.sampled,
                enc.logprobs,
                enc.body,
            ),
        )
        # The row is in (this transaction): only now may later prompts build on it.
        self._seq[sid] = record.seq = seq + 1
        self._prefixes.remember(sid, record.completion_id, enc.prompt)
        return record

    # -- reading -------------------------------------------------------------------------

    def _rows(self, sql: str, params: tuple[Any, ...]) -> list[sqlite3.Row]:
        with self._read_lock:
            return self._read.execute(sql, params).fetchall()

    def _row(self, completion_id: str) -> sqlite3.Row | None:
        rows = self._rows("SELECT * FROM completions WHERE completion_id = ?", (completion_id,))
        return rows[0] if rows else None

    def session_ids(self) -> list[str]:
        return [
            r["session_id"]
            for r in self._rows("SELECT session_id FROM sessions ORDER BY created_at", ())
        ]

    def sessions(self) -> dict[str, dict[str, Any]]:
        rows = self._rows("SELECT session_id, metadata FROM sessions", ())
        return {r["session_id"]: orjson.loads(r["metadata"]) for r in rows}

    def call_counts(self, session_id: str | None = None) -> dict[str, int]:
        """Stored calls per session (all sessions, or one): the store is the count's truth."""
        sql = "SELECT session_id, COUNT(*) FROM completions"
        params: tuple[str, ...] = ()
        if session_id is None:
            sql += " GROUP BY session_id"
        else:
            sql, params = sql + " WHERE session_id = ?", (session_id,)
        return {r[0]: r[1] for r in self._rows(sql, params) if r[0] is not None}

    def summaries(self, session_id: str) -> list[dict[str, Any]]:
        """One small dict per call (no token payloads): for listing a session's completions."""
        rows = self._rows(
            "SELECT completion_id, seq, provider, model, finish_reason, started_at, finished_at, "
            "policy_version, n_prompt, n_sampled, flags, tags FROM completions "
            "WHERE session_id = ? ORDER BY seq",
            (session_id,),
        )
        out = []
        for r in rows:
            item = dict(r)
            item["flags"] = orjson.loads(item["flags"])
            item["tags"] = orjson.loads(item["tags"])
            out.append(item)
        return out

    def records(self, session_id: str) -> list[CaptureRecord]:
        """All records of a session in call order, prompts rebuilt from their shared prefixes.

        Raises :class:`CorruptRecord` naming the first row that does not decode exactly.
        """
        out = []
        for item in self.iter_records(session_id):
            if isinstance(item, RecordFault):
                raise CorruptRecord(item.completion_id, item.error)
            out.append(item)
        return out

    def iter_records(
        self, session_id: str, *, after_seq: int = -1, limit: int | None = None
    ) -> Iterator[CaptureRecord | RecordFault]:
        """A session's records in call order, read a page at a time (memory stays bounded
        however long the session); a row that does not decode yields a :class:`RecordFault`."""
        decoder = RowDecoder(self._row)
        left = limit
        while left is None or left > 0:
            page = _PAGE if left is None else min(_PAGE, left)
            rows = self._rows(
                "SELECT * FROM completions WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (session_id, after_seq, page),
            )
            for row in rows:
                yield decode_or_fault(decoder, row)
            if len(rows) < page:
                return
            after_seq = rows[-1]["seq"]
            left = None if left is None else left - len(rows)

    def last_engine(self, session_id: str) -> str | None:
        """The engine (with its replica, in a pool) that served the session's latest call: an
        engine pool's session affinity after a gateway restart."""
        rows = self._rows(
            "SELECT completion_id FROM completions WHERE session_id = ? ORDER BY seq DESC LIMIT 1",
            (session_id,),
        )
        record = self.record(rows[0]["completion_id"]) if rows else None
        return record.engine if record is not None else None

    def record(self, completion_id: str, *, session_id: str | None = None) -> CaptureRecord | None:
        """One record by completion id (None if absent, or not of ``session_id`` when given);
        raises :class:`CorruptRecord` if it does not decode exactly."""
        row = self._row(completion_id)
        if row is None or (session_id is not None and row["session_id"] != session_id):
            return None
        return RowDecoder(self._row).record(row)

    def reply(self, reply_id: str, session_id: str) -> tuple[str, dict[str, Any]] | None:
        """A kept reply of ``session_id``: its call's completion id and its body (None if the
        session kept none by that id)."""
        rows = self._rows(
            "SELECT completion_id, body FROM replies WHERE reply_id = ? AND session_id = ?",
            (reply_id, session_id),
        )
        if not rows:
            return None
        return rows[0]["completion_id"], orjson.loads(decompress_body(rows[0]["body"]))

    def storage_stats(self, session_id: str) -> dict[str, int]:
        """Prompt tokens captured vs stored, to show the prefix sharing at work."""
        rows = self._rows(
            "SELECT SUM(n_prompt) AS captured, SUM(LENGTH(prompt_suffix)) / 4 AS stored "
            "FROM completions WHERE session_id = ?",
            (session_id,),
        )
        return {
            "prompt_tokens_captured": rows[0]["captured"] or 0,
            "prompt_tokens_stored": rows[0]["stored"] or 0,
        }


def decode_or_fault(decoder: RowDecoder, row: sqlite3.Row) -> CaptureRecord | RecordFault:
    """The row's record, or the fault that keeps it from decoding exactly (named by this row
    even when the broken link is further up its prompt's chain of bases)."""
    cid = row["completion_id"]
    try:
        return decoder.record(row)
    except CorruptRecord as exc:
        reason = exc.reason
        if exc.completion_id != cid:
            reason = f"its prompt's chain of bases is broken at {exc.completion_id}: {reason}"
        return RecordFault(cid, row["session_id"], row["seq"], reason)


def _set_max_bytes(conn: sqlite3.Connection, max_bytes: int | None) -> None:
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    pages = 4294967294 if max_bytes is None else max(1, max_bytes // page_size)
    conn.execute(f"PRAGMA max_page_count={pages}")


def _store_error(exc: sqlite3.Error, busy_ms: int) -> CaptureUnavailable:
    """The provider-facing error for a commit the store could not make, naming the cause."""
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    if code == _SQLITE_FULL or "disk is full" in str(exc):
        return InsufficientStorage(
            f"capture store is full ({exc}): new calls are refused until space returns; "
            "stored records stay readable",
            retry_after=5,
        )
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return CaptureUnavailable(
            f"capture store write lock held by another connection for over {busy_ms} ms "
            f"({exc}): new calls are refused until it is released",
            retry_after=1,
        )
    return CaptureUnavailable(f"capture store cannot commit ({exc})", retry_after=1)
