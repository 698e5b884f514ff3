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
from typing import Any, Literal, assert_never

import orjson
import zstandard

from polar.capture.closed_column import add_closed_column
from polar.capture.operations import (
    AppendRecord,
    CloseSession,
    DeleteSession,
    EncodedRecord,
    ForgetReply,
    KeepReply,
    OpenSession,
    Prepared,
    ReplyRow,
    SessionRow,
    StoreOp,
)
from polar.capture.records import CaptureRecord
from polar.capture.rows import BODY_FIELDS, RowDecoder, decompress_body
from polar.capture.schema import create_or_migrate
from polar.capture.token_blobs import PrefixIndex, exact_ids, logprobs_to_blob
from polar.errors import CaptureError, CaptureUnavailable, CorruptRecord, InsufficientStorage

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
        create_or_migrate(conn)
        add_closed_column(conn)
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
        return await asyncio.wrap_future(self.submit(AppendRecord(record)))

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
        await asyncio.wrap_future(self.submit(OpenSession(session_id, metadata)))

    async def close_session(self, session_id: str) -> None:
        """Mark a session closed (its row's ``closed`` column): its key must not come back to
        life when a gateway restarts."""
        await asyncio.wrap_future(self.submit(CloseSession(session_id)))

    async def keep_reply(
        self, session_id: str, reply_id: str, completion_id: str, body: dict[str, Any]
    ) -> None:
        """Keep the reply a client may fetch again or continue (APIs with stored responses)."""
        await asyncio.wrap_future(self.submit(KeepReply(session_id, reply_id, completion_id, body)))

    async def forget_reply(self, session_id: str, reply_id: str) -> bool:
        """Drop a kept reply (its call's record stays); False if the session has none by that id."""
        return bool(await asyncio.wrap_future(self.submit(ForgetReply(session_id, reply_id))))

    async def delete_session(self, session_id: str) -> None:
        """Drop a session's calls; its row stays, closed (a deleted id is never reopened)."""
        await asyncio.wrap_future(self.submit(DeleteSession(session_id)))

    def submit(self, op: StoreOp) -> Future[Any]:
        """Queue ``op`` for the writer thread; the future gets its result once committed."""
        if not isinstance(op, StoreOp):  # the writer would have nothing to dispatch it to
            raise TypeError(f"not a capture store operation: {op!r}")
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

    def _next_batch(self) -> list[tuple[StoreOp, Future[Any]]] | None:
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

    def _commit(self, conn: sqlite3.Connection, batch: list[tuple[StoreOp, Future[Any]]]) -> None:
        ready: list[tuple[Prepared, Future[Any]]] = []
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
            for prepared, future in ready:
                try:
                    done.append((future, self._apply(conn, prepared)))
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

    def _prepare(self, op: StoreOp) -> Prepared:
        """Everything about ``op`` that can fail without the database, done before the batch."""
        match op:
            case AppendRecord(record):
                return self._encode(record)
            case OpenSession(session_id, metadata):
                try:
                    return SessionRow(session_id, orjson.dumps(metadata))
                except orjson.JSONEncodeError as exc:
                    raise CaptureError(f"session metadata cannot be stored: {exc}") from exc
            case KeepReply(session_id, reply_id, completion_id, body):
                try:
                    blob = self._compressor.compress(orjson.dumps(body))
                except orjson.JSONEncodeError as exc:
                    raise CaptureError(f"reply cannot be stored: {exc}") from exc
                return ReplyRow(session_id, reply_id, completion_id, blob)
            case CloseSession() | DeleteSession() | ForgetReply():
                return op
            case _:
                assert_never(op)

    def _encode(self, record: CaptureRecord) -> EncodedRecord:
        n_sampled = len(record.sampled_ids)
        if record.logprobs is not None and len(record.logprobs) != n_sampled:
            raise CaptureError(
                f"completion not stored: {len(record.logprobs)} logprobs for "
                f"{n_sampled} sampled ids"
            )
        body = {name: getattr(record, name) for name in BODY_FIELDS}
        try:
            return EncodedRecord(
                record=record,
                prompt=exact_ids(record.prompt_ids, "prompt ids"),
                sampled=exact_ids(record.sampled_ids, "sampled ids").tobytes(),
                logprobs=logprobs_to_blob(record.logprobs),
                flags=orjson.dumps(record.flags).decode(),
                tags=orjson.dumps(record.tags).decode(),
                body=self._compressor.compress(orjson.dumps(body)),
                harness_ids=(
                    record.harness_ids.model_dump_json() if record.harness_ids is not None else None
                ),
                call_ids=[(record.session_id, *pair) for pair in record.call_id_pairs()],
            )
        except (ValueError, TypeError, orjson.JSONEncodeError) as exc:
            raise CaptureError(
                f"completion not stored, it cannot be stored exactly: {exc}"
            ) from exc

    def _apply(self, conn: sqlite3.Connection, op: Prepared) -> Any:
        match op:
            case EncodedRecord():
                return self._insert_record(conn, op)
            case SessionRow(session_id, metadata):
                conn.execute(
                    "INSERT OR REPLACE INTO sessions (session_id, created_at, metadata) "
                    "VALUES (?, ?, ?)",
                    (session_id, time.time(), metadata),
                )
                return None
            case CloseSession(session_id):
                self._close(conn, session_id)
                return None
            case ReplyRow(session_id, reply_id, completion_id, body):
                conn.execute(
                    "INSERT OR REPLACE INTO replies VALUES (?, ?, ?, ?)",
                    (reply_id, session_id, completion_id, body),
                )
                return None
            case ForgetReply(session_id, reply_id):
                cursor = conn.execute(
                    "DELETE FROM replies WHERE reply_id = ? AND session_id = ?",
                    (reply_id, session_id),
                )
                return cursor.rowcount > 0
            case DeleteSession(session_id):
                self._delete(conn, session_id)
                return None
            case _:
                assert_never(op)

    def _delete(self, conn: sqlite3.Connection, session_id: str) -> None:
        """The calls go; the session's row stays, closed, so its id is never reused."""
        conn.execute("DELETE FROM completions WHERE session_id = ?", (session_id,))
        conn.execute("DELETE FROM replies WHERE session_id = ?", (session_id,))
        conn.execute("DELETE FROM call_ids WHERE session_id = ?", (session_id,))
        self._close(conn, session_id)
        self._prefixes.forget(session_id)
        self._seq.pop(session_id, None)

    def _close(self, conn: sqlite3.Connection, session_id: str) -> None:
        conn.execute("UPDATE sessions SET closed = 1 WHERE session_id = ?", (session_id,))

    def _insert_record(self, conn: sqlite3.Connection, enc: EncodedRecord) -> CaptureRecord:
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
            "INSERT INTO completions VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
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
                enc.harness_ids,
            ),
        )
        # Each id is issued once per session; OR IGNORE all the same: the record's row is in.
        conn.executemany("INSERT OR IGNORE INTO call_ids VALUES (?, ?, ?)", enc.call_ids)
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
        """Every session's metadata, open or closed (:meth:`closed_sessions` says which)."""
        rows = self._rows("SELECT session_id, metadata FROM sessions", ())
        return {r["session_id"]: orjson.loads(r["metadata"]) for r in rows}

    def closed_sessions(self) -> set[str]:
        """The ids of closed (or deleted) sessions: never opened again."""
        return {r[0] for r in self._rows("SELECT session_id FROM sessions WHERE closed", ())}

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

    def call_ids(self, session_id: str) -> dict[str, str]:
        """Every tool-call id ``session_id``'s harness was given -> the model's own id, so a
        restarted gateway maps them back and issues none again (gateway/call_ids.py)."""
        sql = "SELECT call_id, model_call_id FROM call_ids WHERE session_id = ?"
        return {r[0]: r[1] for r in self._rows(sql, (session_id,))}

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
