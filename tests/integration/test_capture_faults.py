"""Capture integrity under faults, through a live gateway on loopback with concurrent sessions.

Each test injects one fault (a poison request, an engine repeating its completion id, a full
store, a write lock held by another connection, malformed engine token fields) while sessions
keep calling, then checks: only the faulty calls failed, in the caller's provider shape; every
acknowledged completion is stored and token-exact; ``polar capture verify`` passes.
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from polar.capture.store import CaptureStore
from polar.capture.verify import verify_store
from polar.cli.main import main as polar_main
from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine, ScriptedReply
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.server import BackgroundServer
from polar.gateway.services import app_services

pytestmark = pytest.mark.slow


class FaultyBackend(ScriptedBackend):
    """The scripted engine, optionally repeating one completion id or breaking a token field."""

    fixed_id: str | None = None
    malformed: bool = False
    bad_id: int | None = None

    def respond(self, body: dict[str, Any], reply: ScriptedReply) -> dict[str, Any]:
        return self._spoil(super().respond(body, reply))

    def respond_tokens(self, body: dict[str, Any], reply: ScriptedReply) -> dict[str, Any]:
        return self._spoil(super().respond_tokens(body, reply))

    def _spoil(self, out: dict[str, Any]) -> dict[str, Any]:
        if self.fixed_id:
            out["id"] = self.fixed_id
        if self.malformed:
            out["choices"][0]["token_ids"] = [1, "two", 3]
        if self.bad_id is not None:
            out["choices"][0]["token_ids"][-1] = self.bad_id
        return out


class Gateway:
    def __init__(self, server: BackgroundServer, backend: FaultyBackend, store: CaptureStore):
        self.url = server.url
        self.backend = backend
        self.store = store

    def expected(self) -> dict[str, tuple[list[int], list[int], list[float]]]:
        """What the engine returned, by reply text: (prompt ids, sampled ids, logprobs)."""
        out = {}
        for reply in self.backend.log:
            choice = reply["choices"][0]
            text = (choice.get("message") or {}).get("content") or choice.get("text")
            prompt = reply.get("prompt_token_ids") or choice.get("prompt_token_ids")
            lp = choice["logprobs"]
            logprobs = [e["logprob"] for e in lp["content"]] if "content" in lp else None
            out[text] = (prompt, choice["token_ids"], logprobs or lp.get("token_logprobs"))
        return out


@pytest.fixture
def gateway(tmp_path, tokenizer) -> Iterator[Any]:
    servers: list[BackgroundServer] = []

    def build(config: dict[str, Any] | None = None, **store_options: Any) -> Gateway:
        db = tmp_path / "captures.db"
        replies = [ScriptedReply(content=f"reply number {n}") for n in range(2000)]
        backend = FaultyBackend(Script(replies), tokenizer=tokenizer)
        store = CaptureStore(db, **store_options)
        # auth: loopback experiments' opt-out; these tests are about the store, not tokens
        config = GatewayConfig(capture_db=db, auth=False, **(config or {}))
        app = create_app(config, engine=ScriptedEngine(backend), store=store)
        server = BackgroundServer(app).start()
        servers.append(server)
        return Gateway(server, backend, store)

    yield build
    for server in servers:
        server.stop()


async def _session(client: httpx.AsyncClient) -> str:
    reply = await client.post("/polar/sessions", json={})
    return reply.json()["session_id"]


async def _converse(
    client: httpx.AsyncClient, key: str, turns: int, pause_s: float = 0.0
) -> list[httpx.Response]:
    """One agent session: each turn resends the whole conversation plus one new message."""
    messages = [{"role": "system", "content": "You are terse."}]
    replies = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"step {turn}: go on with the task"})
        reply = await client.post(
            f"/s/{key}/v1/chat/completions", json={"model": "m", "messages": messages}
        )
        replies.append(reply)
        if reply.status_code == 200:
            messages.append(reply.json()["choices"][0]["message"])
        await asyncio.sleep(pause_s)
    return replies


async def _keys(gw: Gateway, n: int) -> list[str]:
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
        return [await _session(client) for _ in range(n)]


async def _sessions(
    gw: Gateway, n: int, turns: int, pause_s: float = 0.0, keys: list[str] | None = None
) -> list[httpx.Response]:
    keys = keys or await _keys(gw, n)
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
        runs = await asyncio.gather(*(_converse(client, k, turns, pause_s) for k in keys))
    return [r for run in runs for r in run]


def _assert_acknowledged_exact(gw: Gateway, replies: list[httpx.Response]) -> None:
    """Every 200 is stored under the id the harness saw, token-exact; nothing else is stored."""
    expected = gw.expected()
    acked = [r.json() for r in replies if r.status_code == 200]
    assert len({a["id"] for a in acked}) == len(acked)
    for answer in acked:
        record = gw.store.record(answer["id"])
        assert record is not None, answer["id"]
        prompt, sampled, logprobs = expected[answer["choices"][0]["message"]["content"]]
        assert record.prompt_ids == prompt
        assert record.sampled_ids == sampled
        assert record.logprobs == logprobs
    stored = sum(gw.store.call_counts().values())
    assert stored == len(acked)
    report = verify_store(gw.store.path)
    assert report.ok and report.records == stored
    assert polar_main(["capture", "verify", str(gw.store.path)]) == 0


def _nested(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth):
        value = {"x": value}
    return value


# (path, body with a poison field, how the provider shapes its error)
POISON = {
    "openai_chat": (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        lambda b: b["error"]["type"] == "invalid_request_error",
    ),
    "anthropic": (
        "/v1/messages",
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        lambda b: b["type"] == "error" and b["error"]["type"] == "invalid_request_error",
    ),
    "google": (
        "/v1beta/models/m:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        lambda b: b["error"]["status"] == "INVALID_ARGUMENT",
    ),
}


async def test_poison_requests_fail_alone_among_concurrent_sessions(gateway):
    gw = gateway()

    async def poison(depth: int, provider: str) -> httpx.Response:
        path, body, shaped = POISON[provider]
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
            key = await _session(client)
            await asyncio.sleep(0.05)  # land among the other sessions' calls
            # ``depth`` objects deep, below the top level (json and orjson cannot write it).
            field = b'"unknown_field":' + b'{"x":' * (depth - 1) + b"{}" + b"}" * (depth - 1)
            raw = orjson.dumps(body)[:-1] + b"," + field + b"}"
            reply = await client.post(f"/s/{key}{path}", content=raw)
        assert reply.status_code == 400, (depth, provider, reply.text)
        assert shaped(reply.json()), reply.text
        return reply

    poisons = [(d, p) for d in (241, 300, 1000) for p in POISON]
    results = await asyncio.gather(_sessions(gw, 8, 5), *(poison(d, p) for d, p in poisons))
    replies = results[0]
    assert [r.status_code for r in replies] == [200] * 40
    _assert_acknowledged_exact(gw, replies)
    # Past orjson's parse limit too, and just inside the storable depth: stored as usual.
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
        key = await _session(client)
        path, body, _ = POISON["openai_chat"]
        deep = await client.post(f"/s/{key}{path}", content=b"[" * 1100 + b"]" * 1100)
        assert deep.status_code == 400 and "not valid JSON" in deep.json()["error"]["message"]
        ok = await client.post(f"/s/{key}{path}", json={**body, "meta": _nested(230)})
        assert ok.status_code == 200
    assert gw.store.record(ok.json()["id"]).request["meta"] == _nested(230)


async def test_an_engine_repeating_its_completion_id_never_aliases(gateway):
    # Engine-side rendering: the engine's chat reply and its id reach the record as sent.
    gw = gateway({"render": {"mode": "engine"}})
    gw.backend.fixed_id = "chatcmpl-always-the-same"
    replies = await _sessions(gw, 6, 5)
    assert [r.status_code for r in replies] == [200] * 30
    _assert_acknowledged_exact(gw, replies)
    record = gw.store.record(replies[0].json()["id"])
    assert record.engine_completion_id == "chatcmpl-always-the-same"
    assert record.completion_id != record.engine_completion_id


async def test_a_full_store_refuses_with_507_keeps_reads_and_recovers(gateway):
    gw = gateway(retry_after_s=1.0)
    first = await _sessions(gw, 4, 3)
    with sqlite3.connect(gw.store.path) as conn:
        used = conn.execute("PRAGMA page_count").fetchone()[0] * 4096
    gw.store.max_bytes = used + 8 * 1024  # the "disk" fills up while sessions run
    during = await _sessions(gw, 6, 8, pause_s=0.02)
    refused = [r for r in during if r.status_code != 200]
    assert refused and {r.status_code for r in refused} == {507}
    error = refused[0].json()["error"]
    assert error["code"] == "insufficient_storage" and "full" in error["message"]

    gw.store.max_bytes = 4096  # no room at all now (SQLite keeps what is there)
    key = first[0].request.url.path.split("/")[2]
    big = {**POISON["openai_chat"][1], "user": secrets.token_hex(100_000)}  # 100 KB zstd'ed
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
        full = await client.post(f"/s/{key}/v1/chat/completions", json=big)
        assert full.status_code == 507 and full.headers["retry-after"] == "5"
        # Within the refusal window every call is refused at once, in its provider's shape.
        anthropic = await client.post(f"/s/{key}/v1/messages", json=POISON["anthropic"][1])
        assert anthropic.status_code == 507 and anthropic.json()["type"] == "error"
        assert "full" in anthropic.json()["error"]["message"]
        sessions = (await client.get("/polar/sessions")).json()
        for info in sessions:  # reads keep serving: every session, its records all there
            records = await client.get(f"/polar/sessions/{info['session_id']}/records")
            assert records.status_code == 200 and len(records.json()) == info["calls"]
    gw.store.max_bytes = None  # space returns
    await asyncio.sleep(1.1)
    after = await _sessions(gw, 3, 3)
    assert [r.status_code for r in after] == [200] * 9
    assert gw.store.fault is None
    _assert_acknowledged_exact(gw, first + during + [full, anthropic] + after)


async def test_a_held_write_lock_refuses_with_503_keeps_reads_and_recovers(gateway):
    gw = gateway(busy_timeout_s=0.3, retry_after_s=0.2)
    before = await _sessions(gw, 3, 2)
    keys = await _keys(gw, 4)
    other = sqlite3.connect(gw.store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    started = time.monotonic()
    during = await _sessions(gw, 4, 2, keys=keys)
    assert {r.status_code for r in during} == {503}
    assert time.monotonic() - started < 5  # refused fast, not each waiting on the lock
    assert "write lock" in during[0].json()["error"]["message"]
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
        info = (await client.get("/polar/sessions")).json()
        assert sum(i["calls"] for i in info) == 6
        refused = await client.post("/polar/sessions", json={})  # a write: refused, in words
        assert refused.status_code == 503 and "write lock" in refused.json()["detail"]
    other.execute("ROLLBACK")
    other.close()
    await asyncio.sleep(0.3)
    after = await _sessions(gw, 3, 2)
    assert [r.status_code for r in after] == [200] * 6
    _assert_acknowledged_exact(gw, before + during + after)


async def test_malformed_engine_token_fields_are_a_502_and_nothing_is_stored(gateway):
    gw = gateway({"render": {"mode": "engine"}})  # the chat reply parsed by engines/capture.py
    gw.backend.malformed = True
    replies = await _sessions(gw, 2, 1)
    assert [r.status_code for r in replies] == [502, 502]
    message = replies[0].json()["error"]["message"]
    assert "malformed token fields" in message and "token_ids[1]" in message
    assert gw.store.call_counts() == {}


@pytest.mark.parametrize("render", ["engine", "gateway"])
@pytest.mark.parametrize("bad_id", [2**31, -1, 2**40])
async def test_token_ids_past_int32_or_negative_are_a_502_engine_error(gateway, render, bad_id):
    gw = gateway({"render": {"mode": render}})
    gw.backend.bad_id = bad_id
    [reply] = await _sessions(gw, 1, 1)
    assert reply.status_code == 502, reply.text
    error = reply.json()["error"]
    assert error["code"] == "engine_error" and str(bad_id) in error["message"], error
    assert gw.store.call_counts() == {}


async def test_calls_survive_a_restart_and_records_page_and_report_a_corrupt_row(gateway, tmp_path):
    gw = gateway()
    await _sessions(gw, 1, 6)
    [sid] = gw.store.call_counts()
    gw.store.close()
    with sqlite3.connect(gw.store.path) as conn:  # one row's blob torn on disk
        conn.execute(
            "UPDATE completions SET sampled = x'00' WHERE session_id = ? AND seq = 4", (sid,)
        )
    db = gw.store.path
    app = create_app(
        GatewayConfig(capture_db=db, auth=False),
        store=CaptureStore(db),
        engine=ScriptedEngine(FaultyBackend(Script())),
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        assert (await client.get(f"/polar/sessions/{sid}")).json()["calls"] == 6
        items = (await client.get(f"/polar/sessions/{sid}/records")).json()
        assert [i["seq"] for i in items] == [0, 1, 2, 3, 4, 5]
        assert "error" in items[4] and "undecodable" in items[4]["error"]
        assert all("error" not in i for i in items[:4] + items[5:])
        page = (await client.get(f"/polar/sessions/{sid}/records?after_seq=1&limit=2")).json()
        assert [i["seq"] for i in page] == [2, 3]
        bad = await client.get(f"/polar/sessions/{sid}/records/{items[4]['completion_id']}")
        assert bad.status_code == 500 and "corrupt record" in bad.json()["detail"]
    app_services(app).store.close()
    assert polar_main(["capture", "verify", str(db)]) == 1


async def _recovery_s(gw: Gateway, keys: list[str], clear: Any) -> tuple[float, list[int]]:
    """Calls on ``keys`` (no other traffic: no new session, no admin write) before and after
    ``clear()`` ends the fault; how long after it the first call succeeded, and every status."""
    statuses: list[int] = []
    cleared_at: list[float] = []
    body = {**POISON["openai_chat"][1], "user": secrets.token_hex(20_000)}  # never fits a page

    async def caller(client: httpx.AsyncClient, key: str) -> float:
        while True:
            reply = await client.post(f"/s/{key}/v1/chat/completions", json=body)
            statuses.append(reply.status_code)
            if reply.status_code == 200 and cleared_at:
                return time.monotonic() - cleared_at[0]
            assert reply.status_code in (503, 507), reply.text
            if time.monotonic() - (cleared_at or [time.monotonic()])[0] > 10:
                raise AssertionError(f"no recovery 10 s after the fault cleared: {statuses[-5:]}")
            await asyncio.sleep(0.05)

    async def clearing() -> None:
        await clear()
        cleared_at.append(time.monotonic())

    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
        done = await asyncio.gather(clearing(), *(caller(client, k) for k in keys))
    return min(done[1:]), statuses


async def test_a_full_store_recovers_within_a_second_under_call_traffic_alone(gateway):
    gw = gateway()
    keys = await _keys(gw, 3)
    gw.store.max_bytes = 4096  # the disk is full (SQLite keeps what is there)

    async def space_returns() -> None:
        await asyncio.sleep(2.5)
        gw.store.max_bytes = None

    recovered, statuses = await _recovery_s(gw, keys, space_returns)
    assert 507 in statuses and recovered < 1.0, (recovered, statuses)
    assert gw.store.fault is None


async def test_a_25_s_write_lock_recovers_within_a_second_under_call_traffic_alone(gateway):
    gw = gateway()  # the default busy timeout (10 s): the lock outlasts two of them
    keys = await _keys(gw, 3)
    other = sqlite3.connect(gw.store.path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")

    async def lock_released() -> None:
        await asyncio.sleep(25)
        other.execute("ROLLBACK")
        other.close()

    recovered, statuses = await _recovery_s(gw, keys, lock_released)
    assert 503 in statuses and recovered < 1.0, (recovered, statuses)
    assert gw.store.fault is None
