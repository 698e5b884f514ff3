"""The rollout server's event stream (Server-Sent Events): task and session progress as it happens.

Events are numbered; a client that reconnects with ``Last-Event-ID`` gets what it missed from a
bounded history. A subscriber too slow to keep up is dropped rather than slowing the server.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson

from polar.schemas.rollout import EventKind


@dataclass(frozen=True)
class Event:
    id: int
    kind: EventKind
    data: dict[str, Any]

    def frame(self) -> bytes:
        body = orjson.dumps(self.data).decode()
        return f"id: {self.id}\nevent: {self.kind.value}\ndata: {body}\n\n".encode()

    def matches(self, task_id: str | None) -> bool:
        return task_id is None or self.data.get("task_id") == task_id


class EventBus:
    """Fan-out of events to SSE subscribers, with a replay history."""

    def __init__(self, history: int = 2048, subscriber_queue: int = 1024) -> None:
        self._history: deque[Event] = deque(maxlen=history)
        self._subscribers: set[asyncio.Queue[Event | None]] = set()
        self._subscriber_queue = subscriber_queue
        self._next_id = 1

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def publish(self, kind: EventKind, **data: Any) -> Event:
        event = Event(self._next_id, kind, data)
        self._next_id += 1
        self._history.append(event)
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                # Too slow: end its stream; it can reconnect with Last-Event-ID and replay.
                self._subscribers.discard(queue)
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait(None)
        return event

    def close(self) -> None:
        """End every open stream (server shutdown)."""
        for queue in list(self._subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)
        self._subscribers.clear()

    async def stream(
        self,
        task_id: str | None = None,
        last_event_id: int = 0,
        keepalive_s: float = 15.0,
    ) -> AsyncIterator[bytes]:
        """SSE frames: missed events after ``last_event_id``, then live ones, with keepalives."""
        queue: asyncio.Queue[Event | None] = asyncio.Queue(self._subscriber_queue)
        self._subscribers.add(queue)
        try:
            yield b": connected\n\n"
            for event in list(self._history):
                if event.id > last_event_id and event.matches(task_id):
                    yield event.frame()
                    last_event_id = event.id
            while True:
                try:
                    async with asyncio.timeout(keepalive_s):
                        item = await queue.get()
                except TimeoutError:
                    yield b": keepalive\n\n"
                    continue
                if item is None:
                    return
                if item.id > last_event_id and item.matches(task_id):
                    yield item.frame()
        finally:
            self._subscribers.discard(queue)
