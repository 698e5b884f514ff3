from __future__ import annotations

import asyncio
import sqlite3
import time
import zlib

import pytest
import zstandard

from polar.capture.operations import DeleteSession, KeepReply, OpenSession
from polar.capture.records import CaptureRecord
from polar.capture.store import CaptureStore
from polar.errors import CaptureError
from polar.gateway.services import app_services


def _record(
    session: str, cid: str, prompt: list[int], sampled: list[int], logprobs=None, **fields
) -> CaptureRecord:
    now = time.time()
    return CaptureRecord(
        **{
            "completion_id": cid,
            "session_id": session,
            "provider": "openai_chat",
            "model": "m",
            "engine": "scripted",
            "started_at": now,
            "finished_at": now,
            "request": {"messages": [{"role": "user", "content": "x"}]},
            "upstream_request": {"model": "m"},
            "response": {"role": "assistant", "content": "y"},
            "prompt_ids": prompt,
            "sampled_ids": sampled,
            "logprobs": logprobs,
            "finish_reason": "stop",
        }
        | fields
    )


def test_records_round_trip_exactly_and_survive_reopen(tmp_path):
    db = tmp_path / "c.db"
    store = CaptureStore(db)
    lp = [-0.1234567890123, -1e-9, -7.5]
    asyncio.run(store.add_session("s1", {"task": "t"}))
    saved = asyncio.run(store.append(_record("s1", "c1", [1, 2, 3, 70000], [5, 6, 2], lp)))
    assert saved.seq == 0
    store.close()
    reopened = CaptureStore(db)
    [record] = reopened.records("s1")
    assert record.prompt_ids == [1, 2, 3, 70000]
    assert record.sampled_ids == [5, 6, 2]
    assert record.logprobs == lp  # float64 storage: bit-exact
    assert record.request == {"messages": [{"role": "user", "content": "x"}]}
    assert reopened.sessions() == {"s1": {"task": "t"}}
    reopened.close()


def test_bodies_are_zstd_and_stores_written_with_zlib_still_read(tmp_path):
    db = tmp_path / "c.db"
    store = CaptureStore(db)
    asyncio.run(store.append(_record("s1", "c1", [1, 2], [3])))
    asyncio.run(store.append(_record("s1", "c2", [1, 2, 3, 4], [5])))
    store.close()
    with sqlite3.connect(db) as conn:
        bodies = dict(conn.execute("SELECT completion_id, body FROM completions"))
        assert all(blob[:4] == b"\x28\xb5\x2f\xfd" for blob in bodies.values())
        # c1 as a store from before zstd wrote it
        old = zlib.compress(zstandard.ZstdDecompressor().decompress(bodies["c1"]), 1)
        conn.execute("UPDATE completions SET body = ? WHERE completion_id = 'c1'", (old,))
    reopened = CaptureStore(db)
    first, second = reopened.records("s1")
    assert first.request == second.request == {"messages": [{"role": "user", "content": "x"}]}
    assert (first.engine, first.response["content"]) == ("scripted", "y")
    reopened.close()


def test_growing_prompts_share_prefixes(tmp_path):
    store = CaptureStore(tmp_path / "c.db")
    prompt: list[int] = list(range(1000))
    expected = []
    for turn in range(30):
        asyncio.run(store.append(_record("s", f"c{turn}", list(prompt), [9, 9, 2])))
        expected.append(list(prompt))
        prompt = [*prompt, 9, 9, 2, *range(turn * 10, turn * 10 + 50)]
    records = store.records("s")
    assert [r.prompt_ids for r in records] == expected
    assert [r.seq for r in records] == list(range(30))
    stats = store.storage_stats("s")
    assert stats["prompt_tokens_captured"] == sum(len(p) for p in expected)
    # Each turn stores only its new tokens: the last prompt's length, not the sum of all.
    assert stats["prompt_tokens_stored"] == len(expected[-1])
    assert store.record("c17").prompt_ids == expected[17]
    store.close()


def test_interleaved_sessions_and_branches_rebuild(tmp_path):
    store = CaptureStore(tmp_path / "c.db")
    a1, b1 = list(range(100)), list(range(500, 600))
    branch = list(range(50)) + [7] * 30  # shares only part of a1
    for sid, cid, p in [
        ("a", "a1", a1),
        ("b", "b1", b1),
        ("a", "a2", [*a1, 1, 2]),
        ("a", "a3", branch),
    ]:
        asyncio.run(store.append(_record(sid, cid, p, [2])))
    assert [r.prompt_ids for r in store.records("a")] == [a1, [*a1, 1, 2], branch]
    assert [r.prompt_ids for r in store.records("b")] == [b1]
    asyncio.run(store.delete_session("a"))
    assert store.records("a") == []
    assert len(store.records("b")) == 1
    store.close()


def test_concurrent_appends_all_commit(tmp_path):
    store = CaptureStore(tmp_path / "c.db")

    async def many() -> list[CaptureRecord]:
        return await asyncio.gather(
            *(
                store.append(_record(f"s{i % 7}", f"c{i}", list(range(i, i + 40)), [i]))
                for i in range(300)
            )
        )

    saved = asyncio.run(many())
    assert len({r.completion_id for r in saved}) == 300
    assert sum(len(store.records(f"s{k}")) for k in range(7)) == 300
    assert sorted(r.seq for r in store.records("s0")) == list(range(len(store.records("s0"))))
    store.close()


def test_a_store_from_before_the_closed_column_opens_with_its_closed_sessions(tmp_path):
    """Stores written before the column kept ``"closed": true`` in the session's JSON: the
    column is added and filled from it, and a deleted (closed) id stays closed."""
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE sessions (session_id TEXT PRIMARY KEY, created_at REAL NOT NULL, "
                 "metadata BLOB NOT NULL)")  # fmt: skip
    rows = [("live", b'{"task_id":"t"}'), ("done", b'{"task_id":"t","closed":true}')]
    conn.executemany("INSERT INTO sessions VALUES (?, 0, ?)", rows)
    conn.commit()
    conn.close()
    store = CaptureStore(db)
    assert store.closed_sessions() == {"done"}
    assert store.sessions()["live"] == {"task_id": "t"}
    asyncio.run(store.add_session("new", {}))
    asyncio.run(store.delete_session("live"))
    assert store.closed_sessions() == {"done", "live"}
    store.close()
    again = CaptureStore(db)  # migrated once; the second open finds the column filled
    assert again.closed_sessions() == {"done", "live"}
    again.close()


def test_closed_sessions_stay_closed_after_reopen(tmp_path):
    from polar.gateway.app import create_app
    from polar.gateway.config import GatewayConfig

    db = tmp_path / "c.db"
    store = CaptureStore(db)
    asyncio.run(store.add_session("open", {}))
    asyncio.run(store.add_session("done", {"task": "t"}))
    asyncio.run(store.close_session("done"))
    assert store.sessions()["done"] == {"task": "t"}  # closed is the row's column, not a key
    assert store.closed_sessions() == {"done"}
    store.close()
    app = create_app(
        GatewayConfig(capture_db=db, engine={"kind": "vllm", "base_url": "http://127.0.0.1:9"})
    )
    assert [s.session_id for s in app_services(app).sessions.all()] == ["open"]
    app_services(app).store.close()


def test_each_operation_is_its_own_type_and_a_stray_one_is_refused(tmp_path):
    """Every write goes to the writer as a typed operation; something else is refused at the
    door (the writer thread would have nothing to dispatch it to), and the store still works."""
    store = CaptureStore(tmp_path / "c.db")
    asyncio.run(store.add_session("s", {"task": "t"}))
    body = {"id": "resp_1", "output": []}
    asyncio.run(store.keep_reply("s", "resp_1", "c1", body))
    assert store.reply("resp_1", "s") == ("c1", body)
    assert asyncio.run(store.forget_reply("s", "resp_1")) is True
    assert asyncio.run(store.forget_reply("s", "resp_1")) is False
    assert store.reply("resp_1", "s") is None
    with pytest.raises(TypeError, match="not a capture store operation"):
        store.submit(("session", "s2", {}))  # type: ignore[arg-type]
    future = store.submit(OpenSession("s2", {"n": 1}))
    assert future.result(timeout=10) is None
    assert store.sessions() == {"s": {"task": "t"}, "s2": {"n": 1}}
    asyncio.run(store.append(_record("s2", "c2", [1, 2], [3])))
    store.submit(DeleteSession("s2")).result(timeout=10)
    assert store.records("s2") == []
    assert store.closed_sessions() == {"s2"}
    store.close()


def test_an_unstorable_operation_fails_alone(tmp_path):
    store = CaptureStore(tmp_path / "c.db")
    bad = store.submit(KeepReply("s", "r", "c", {"x": object()}))
    good = store.submit(OpenSession("s", {}))
    with pytest.raises(CaptureError, match="reply cannot be stored"):
        bad.result(timeout=10)
    assert good.result(timeout=10) is None
    assert store.sessions() == {"s": {}}
    store.close()
