"""Pausing upstream generation around a trainer's weight update."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from polar.errors import EngineUnavailable


class GenerationGate:
    """New calls wait while paused; ``pause`` waits for calls already in flight to finish."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._in_flight = 0

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @asynccontextmanager
    async def admit(self, wait_s: float) -> AsyncIterator[None]:
        """Hold a slot for one engine call; waits up to ``wait_s`` while paused."""
        if not self._open.is_set():
            try:
                await asyncio.wait_for(self._open.wait(), wait_s)
            except TimeoutError as exc:
                raise EngineUnavailable(
                    "generation is paused for a weight update", retry_after=5
                ) from exc
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def pause(self, timeout_s: float) -> bool:
        """Stop admitting calls; True once in-flight calls drained within ``timeout_s``."""
        self._open.clear()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def resume(self) -> None:
        self._open.set()
