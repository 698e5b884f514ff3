"""A failed write never corrupts another record; a store that cannot commit says why and recovers."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

from polar.capture.records import CaptureRecord
from polar.capture.store import CaptureStore, RecordFault
from polar.capture.verify import verify_store
from polar.cli.main import main as polar_main
from polar.errors import CaptureError, CaptureUnavailable, CorruptRecord, InsufficientStorage

from .test_store import _record as store_record


def _record(session: str, cid: str, prompt: list[int], sampled=(7, 8, 2), **fields):
    return store_record(session, cid, prompt, list(sampled), [-0.25] * len(sampled), **fields)


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"x": value}
    return value


def _db_bytes(db: Path) -> int:
    """The database's logical size (pages still in the WAL included)."""
    with sqlite3.connect(db) as conn:
        return conn.execute("PRAGMA page_count").fetchone()[0] * 4096


@contextmanager
def held_write_lock(db: Path) -> Iterator[sqlite3.Connection]:
    """A second connection holding the write lock (BEGIN IMMEDIATE) until the block ends."""
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield other
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_duplicate_id_fails_alone_and_never_becomes_a_base(tmp_path):
    """The engine-repeats-its-id trigger: the second record with an id must not be stored, and
    no later prompt may be stored against it (that aliased another session's row)."""
    store = CaptureStore(tmp_path / "c.db")
    first = list(range(100, 160))
    asyncio.run(store.append(_record("s1", "dup", first)))
    prompt = list(range(1000, 1450))
    with pytest.raises(CaptureError, match="not stored"):
        asyncio.run(store.append(_record("s2", "dup", prompt)))
    asyncio.run(store.append(_record("s2", "next", [*prompt, 5, 6])))
    [stored] = store.records("s2")
    assert stored.prompt_ids == [*prompt, 5, 6] and stored.seq == 0
    assert store.records("s1")[0].prompt_ids == first
    assert verify_store(store.path).ok
    store.close()


def test_bad_records_in_a_batch_fail_alone(tmp_path):
    db = tmp_path / "c.db"
    store = CaptureStore(db)
    base = list(range(200))
    asyncio.run(store.append(_record("s", "c0", base)))

    async def batch() -> list[object]:
        # The writer waits on the held lock with the first record; the rest queue up behind it
        # and commit together, the bad ones among them.
        with held_write_lock(db):
            tasks = [asyncio.ensure_future(store.append(_record("s", "c1", [*base, 1])))]
            await asyncio.sleep(0.1)
            tasks += [
                asyncio.ensure_future(store.append(r))
                for r in (
                    _record("s", "c2", [*base, 1, 2]),
                    _record("s", "deep", [*base, 9], request=_nested(300)),
                    _record("s", "huge", [*base, 2**31]),
                    _record("s", "c3", [*base, 1, 2, 3]),
                    _record("t", "c0", [1, 2]),  # a duplicate id
                    _record("s", "c4", [*base, 1, 2, 3, 4]),
                    _record("s", "negative", [*base, -1]),
                )
            ]
            await asyncio.sleep(0.1)
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(batch())
    failed = [r for r in results if isinstance(r, BaseException)]
    assert len(failed) == 4 and all(type(e) is CaptureError for e in failed)
    assert "2147483648" in str(results[3]) and "Recursion" in str(results[2])
    assert "negative" in str(results[-1])
    records = store.records("s")
    assert [r.completion_id for r in records] == ["c0", "c1", "c2", "c3", "c4"]
    assert [r.seq for r in records] == [0, 1, 2, 3, 4]  # a failed record takes no seq
    assert records[-1].prompt_ids == [*base, 1, 2, 3, 4]
    assert store.records("t") == []
    assert verify_store(db).ok
    store.close()


def test_disk_full_refuses_with_507_keeps_reads_and_recovers(tmp_path):
    db = tmp_path / "c.db"
    store = CaptureStore(db, retry_after_s=0.2)
    acked: list[CaptureRecord] = []
    prompt: list[int] = []
    for turn in range(40):
        prompt = [*prompt, *range(turn * 1000, turn * 1000 + 500)]
        acked.append(asyncio.run(store.append(_record("s", f"c{turn}", list(prompt)))))
    store.max_bytes = _db_bytes(db) + 64 * 1024  # then the "disk" fills up
    with pytest.raises(InsufficientStorage) as full:
        for turn in range(40, 400):
            prompt = [*prompt, *range(turn * 1000, turn * 1000 + 500)]
            acked.append(asyncio.run(store.append(_record("s", f"c{turn}", list(prompt)))))
    assert full.value.status == 507 and "full" in full.value.message
    started = time.monotonic()
    with pytest.raises(InsufficientStorage):  # refused at once while the fault lasts
        asyncio.run(store.append(_record("s", "refused", [1, 2, 3])))
    assert time.monotonic() - started < 0.1
    assert [r.prompt_ids for r in store.records("s")] == [r.prompt_ids for r in acked]
    assert verify_store(db).ok

    store.max_bytes = None  # space returns
    time.sleep(0.25)
    saved = asyncio.run(store.append(_record("s", "after", [*prompt, 1])))
    assert saved.seq == len(acked) and store.fault is None
    assert store.records("s")[-1].prompt_ids == [*prompt, 1]
    assert verify_store(db).ok
    store.close()


def test_held_write_lock_refuses_with_503_keeps_reads_and_recovers(tmp_path):
    db = tmp_path / "c.db"
    store = CaptureStore(db, busy_timeout_s=0.2, retry_after_s=0.2)
    asyncio.run(store.append(_record("s", "c0", list(range(100)))))
    with held_write_lock(db):
        with pytest.raises(CaptureUnavailable) as locked:
            asyncio.run(store.append(_record("s", "c1", list(range(101)))))
        assert type(locked.value) is CaptureUnavailable and locked.value.status == 503
        assert "write lock" in locked.value.message
        started = time.monotonic()
        with pytest.raises(CaptureUnavailable):
            asyncio.run(store.append(_record("s", "c2", list(range(102)))))
        assert time.monotonic() - started < 0.1  # refused without waiting on the lock again
        assert [r.completion_id for r in store.records("s")] == ["c0"]
    time.sleep(0.25)
    asyncio.run(store.append(_record("s", "c3", list(range(103)))))
    assert [(r.completion_id, r.seq) for r in store.records("s")] == [("c0", 0), ("c3", 1)]
    assert verify_store(db).ok
    store.close()


def test_a_cancelled_append_is_not_written_and_the_writer_lives_on(tmp_path):
    db = tmp_path / "c.db"
    store = CaptureStore(db)

    async def cancel_one() -> None:
        with held_write_lock(db):
            first = asyncio.ensure_future(store.append(_record("s", "a", [1])))
            await asyncio.sleep(0.05)
            gone = asyncio.ensure_future(store.append(_record("s", "gone", [2])))
            await asyncio.sleep(0.05)
            gone.cancel()
        await first

    asyncio.run(cancel_one())
    asyncio.run(store.append(_record("s", "b", [3])))
    assert [r.completion_id for r in store.records("s")] == ["a", "b"]
    store.close()


def _corrupt(db: Path, sql: str, params: tuple) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(sql, params)


def test_a_corrupt_row_is_reported_alone_by_readers_and_verify(tmp_path, capsys):
    db = tmp_path / "c.db"
    store = CaptureStore(db)
    prompt = list(range(300))
    for turn in range(6):
        prompt = [*prompt, turn, turn]
        asyncio.run(store.append(_record("s", f"c{turn}", list(prompt))))
    asyncio.run(store.append(_record("other", "o0", list(range(50)))))
    assert polar_main(["capture", "verify", str(db)]) == 0
    assert "2 sessions, 7 records, 0 faults" in capsys.readouterr().out

    _corrupt(db, "UPDATE completions SET n_prompt = 47 WHERE completion_id = 'c3'", ())
    items = list(store.iter_records("s"))
    faults = [i for i in items if isinstance(i, RecordFault)]
    # c3 itself, and the calls whose prompts are stored against it: nothing else.
    assert [f.completion_id for f in faults] == ["c3", "c4", "c5"]
    assert "rebuilds to 308 ids, the row says 47" in faults[0].error
    assert "chain of bases is broken at c4" in faults[2].error
    assert [i.completion_id for i in items if isinstance(i, CaptureRecord)] == ["c0", "c1", "c2"]
    with pytest.raises(CorruptRecord, match="c3"):
        store.records("s")

    # A base in another session (what an aliased completion id produced) and a torn blob.
    _corrupt(db, "UPDATE completions SET prompt_base = 'o0' WHERE completion_id = 'c5'", ())
    _corrupt(db, "UPDATE completions SET sampled = x'0102' WHERE completion_id = 'c1'", ())
    report = verify_store(db)
    assert not report.ok
    [s] = [v for v in report.sessions if v.session_id == "s"]
    assert {f.completion_id for f in s.faults} == {"c1", "c3", "c4", "c5"}
    assert polar_main(["capture", "verify", str(db)]) == 1
    out = capsys.readouterr().out
    assert "another session" in out and "FAULT  s  6 records, 4 faulty" in out
    assert "ok     other  1 records" in out
    assert polar_main(["capture", "verify", str(db), "--json"]) == 1
    assert orjson.loads(capsys.readouterr().out)["sessions"][0]["records"] in (6, 1)
    assert polar_main(["capture", "verify", str(tmp_path / "missing.db")]) == 2
    store.close()


def test_long_prefix_chains_read_without_recursion(tmp_path):
    store = CaptureStore(tmp_path / "c.db")
    prompt = list(range(20))

    async def fill() -> None:
        nonlocal prompt
        for turn in range(1500):
            prompt = [*prompt, turn % 5000]
            await store.append(_record("s", f"c{turn}", list(prompt), [1]))

    asyncio.run(fill())
    assert store.record("c1499").prompt_ids == prompt  # a 1,500-link chain, walked iteratively
    page = list(store.iter_records("s", after_seq=1000, limit=70))
    assert [r.seq for r in page] == list(range(1001, 1071))
    assert store.call_counts() == {"s": 1500}
    store.close()


def test_call_counts_survive_reopen(tmp_path):
    db = tmp_path / "c.db"
    store = CaptureStore(db)
    for i in range(5):
        asyncio.run(store.append(_record("a" if i < 3 else "b", f"c{i}", [i])))
    store.close()
    reopened = CaptureStore(db)
    assert reopened.call_counts() == {"a": 3, "b": 2}
    assert reopened.call_counts("b") == {"b": 2} and reopened.call_counts("x") == {}
    reopened.close()


def test_full_durability_mode_is_applied(tmp_path):
    store = CaptureStore(tmp_path / "c.db", synchronous="FULL")
    with store._read_lock:  # the pragma is per connection; the writer's matches it
        assert store._read.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    with pytest.raises(ValueError, match="NORMAL or FULL"):
        CaptureStore(tmp_path / "d.db", synchronous="OFF")  # type: ignore[arg-type]
    store.close()
