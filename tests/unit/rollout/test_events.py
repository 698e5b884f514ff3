"""SSE event stream: live events, replay after Last-Event-ID, per-task filter."""

from __future__ import annotations

import asyncio

import pytest

from polar.rollout.events import EventBus
from polar.schemas.rollout import EventKind


async def collect(stream: object, n: int) -> list[bytes]:
    frames = []
    async for frame in stream:  # type: ignore[attr-defined]
        if frame.startswith(b":"):
            continue
        frames.append(frame)
        if len(frames) == n:
            break
    return frames


async def test_replay_then_live_with_task_filter() -> None:
    bus = EventBus()
    bus.publish(EventKind.TASK_SUBMITTED, task_id="a")
    bus.publish(EventKind.TASK_SUBMITTED, task_id="b")
    stream = bus.stream(task_id="a")
    reader = asyncio.create_task(collect(stream, 2))
    await asyncio.sleep(0.01)
    bus.publish(EventKind.SESSION_FINISHED, task_id="b", session_id="x")
    bus.publish(EventKind.SESSION_FINISHED, task_id="a", session_id="y")
    frames = await asyncio.wait_for(reader, 2)
    assert frames[0].startswith(b"id: 1\nevent: task_submitted\n")
    assert b'"session_id":"y"' in frames[1] and frames[1].startswith(b"id: 4\n")
    await stream.aclose()
    assert bus.subscribers == 0


async def test_resume_after_last_event_id() -> None:
    bus = EventBus()
    for i in range(3):
        bus.publish(EventKind.CALLBACK, task_id="t", i=i)
    frames = await asyncio.wait_for(collect(bus.stream(last_event_id=2), 1), 2)
    assert frames == [b'id: 3\nevent: callback\ndata: {"task_id":"t","i":2}\n\n']


async def test_slow_subscriber_is_dropped_and_close_ends_streams() -> None:
    bus = EventBus(subscriber_queue=2)
    stream = bus.stream()
    assert await stream.__anext__() == b": connected\n\n"
    waiter = asyncio.create_task(stream.__anext__())
    await asyncio.sleep(0.01)
    for i in range(5):
        bus.publish(EventKind.CALLBACK, i=i)
    assert bus.subscribers == 0
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiter, 1)
    replay = bus.stream(last_event_id=3)
    await replay.__anext__()
    assert (await replay.__anext__()).startswith(b"id: 4\n")
    await replay.aclose()
    bus2 = EventBus()
    stream2 = bus2.stream()
    await stream2.__anext__()
    bus2.close()
    remaining = [f async for f in stream2]
    assert remaining == []
