"""SessionRegistry, the one owner of a gateway's sessions: open (idempotent, durable first),
close and delete (the key dies now and after a restart), restore; SessionTags read old rows."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from polar.capture.store import CaptureStore
from polar.errors import CaptureError, NodeFull
from polar.gateway.config import NodeConfig
from polar.gateway.node.lifecycle import Lifecycle, NodeSession
from polar.gateway.sessions import SessionClosed, SessionRegistry, SessionTags
from polar.schemas.node import SessionDispatch
from polar.schemas.task import TaskRequest


class Engine:
    """Only what the registry asks of an engine."""

    def __init__(self) -> None:
        self.ended: list[str] = []

    def end_session(self, session_id: str) -> None:
        self.ended.append(session_id)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    store = CaptureStore(tmp_path / "c.db")
    yield store
    store.close()


async def test_open_is_durable_and_idempotent_and_close_is_final(store: CaptureStore) -> None:
    engine = Engine()
    registry = SessionRegistry(store, engine)  # type: ignore[arg-type]
    tags = SessionTags(task_id="t", max_model_calls=3, mine="kept")  # type: ignore[call-arg]
    first, second = await asyncio.gather(registry.open("s1", tags), registry.open("s1", tags))
    assert first is second and registry.get("s1") is first and len(registry) == 1
    assert store.sessions()["s1"] == {"task_id": "t", "max_model_calls": 3, "mine": "kept"}
    await registry.close("s1")
    assert registry.get("s1") is None and registry.is_closed("s1") and engine.ended == ["s1"]
    assert store.closed_sessions() == {"s1"}
    with pytest.raises(SessionClosed):
        await registry.open("s1")
    await registry.open("s2")
    await registry.delete("s2")
    assert store.closed_sessions() == {"s1", "s2"} and engine.ended == ["s1", "s2"]


async def test_a_key_works_only_once_its_row_is_written(store: CaptureStore) -> None:
    registry = SessionRegistry(store)
    store.close()  # the writer is gone: the open fails, and the key never worked
    with pytest.raises(CaptureError):
        await registry.open("s1")
    assert registry.get("s1") is None and not registry.is_closed("s1")


async def test_restore_brings_back_open_sessions_and_a_node_closes_them(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path / "c.db")
    await store.add_session("live", {"task_id": "t", "max_model_calls": "2", "harness": 7})
    await store.add_session("done", {})
    await store.close_session("done")
    registry = SessionRegistry(store)
    assert registry.restore() == []
    live = registry.get("live")
    assert live is not None and registry.is_closed("done")
    # A fact of the wrong type in an old row is left out, not a failed start.
    assert live.tags == SessionTags(task_id="t", max_model_calls=2)
    node = SessionRegistry(store)
    assert node.restore(close_open=True) == ["live"]
    assert node.get("live") is None and node.is_closed("live") and len(node) == 0
    store.close()


def test_tags_keep_the_stored_keys_as_the_bag_had_them() -> None:
    tags = SessionTags(task_id="t", sample_index=0, node_id="n", max_model_calls=None)
    assert tags.stored() == {"task_id": "t", "sample_index": 0, "node_id": "n"}
    old = {"auto_registered": True, "demo": "openai", "closed": True}
    assert SessionTags.read(old).stored() == old
    assert SessionTags.read(old).auto_registered is True


def _dispatch(sid: str) -> SessionDispatch:
    return SessionDispatch(
        session_id=sid.ljust(16, "0"), task=TaskRequest(task_id="t", instruction="x")
    )


class Work:
    def __init__(self, session: NodeSession) -> None:
        self.session = session


async def test_dispatch_admits_and_opens_in_one_call() -> None:
    """A dispatch holds its place while its session opens: another arriving then is counted
    against it (no second check, no undo); an open that fails gives the place back."""
    opening, opened = asyncio.Event(), asyncio.Event()
    fail = {"b".ljust(16, "0")}

    async def open_session(session: NodeSession) -> None:
        opening.set()
        await opened.wait()
        if session.session_id in fail:
            raise CaptureError("store full")

    life = Lifecycle(NodeConfig(queue_limit=1), Work, open_session=open_session)  # type: ignore[arg-type]
    first = asyncio.create_task(life.dispatch(_dispatch("a")))
    await opening.wait()
    with pytest.raises(NodeFull):  # a's place is taken while it opens
        await asyncio.wait_for(life.dispatch(_dispatch("c")), 2)
    again = asyncio.create_task(life.dispatch(_dispatch("a")))  # a retry: the same session
    opened.set()
    (session, created), (same, created_again) = await asyncio.wait_for(
        asyncio.gather(first, again), 2
    )
    assert created and not created_again and same is session
    assert life.counts().queued == 1
    # A failed open gives its place back (queue_limit 1), and the id may come again.
    fresh = Lifecycle(NodeConfig(queue_limit=1), Work, open_session=open_session)  # type: ignore[arg-type]
    with pytest.raises(CaptureError):
        await fresh.dispatch(_dispatch("b"))
    assert fresh.get("b".ljust(16, "0")) is None and fresh.counts().queued == 0
    fail.clear()
    assert (await fresh.dispatch(_dispatch("b")))[1]
