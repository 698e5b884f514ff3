"""The blocking face of :class:`AsyncRolloutClient`, for trainers' synchronous loops.

One implementation: every call runs the async client's coroutine on a private event loop in a
daemon thread, so it works the same inside a program that already runs an event loop (a
notebook, an async trainer). ``progress`` callbacks run on that thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import httpx

from polar.client.async_client import DEFAULT_RETRY, AsyncRolloutClient, Progress
from polar.delivery import RetryPolicy
from polar.schemas.rollout import NodeView, ServerStatus, SessionView, TaskSummary
from polar.schemas.task import TaskRequest, TaskResult

T = TypeVar("T")


class RolloutClient:
    """Use as ``with RolloutClient(url, token=...) as client``; same methods as the async one."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="polar-rollout-client", daemon=True
        )
        self._thread.start()
        self.aio: AsyncRolloutClient = self._call(
            _make(url, token=token, timeout_s=timeout_s, retry=retry, transport=transport)
        )
        self.url = self.aio.url

    def submit(self, task: TaskRequest) -> TaskSummary:
        return self._call(self.aio.submit(task))

    def cancel(self, task_id: str) -> TaskSummary:
        return self._call(self.aio.cancel(task_id))

    def summary(self, task_id: str) -> TaskSummary:
        return self._call(self.aio.summary(task_id))

    def result(self, task_id: str) -> TaskResult:
        return self._call(self.aio.result(task_id))

    def tasks(self) -> list[TaskSummary]:
        return self._call(self.aio.tasks())

    def sessions(self, task_id: str) -> list[SessionView]:
        return self._call(self.aio.sessions(task_id))

    def nodes(self) -> list[NodeView]:
        return self._call(self.aio.nodes())

    def status(self) -> ServerStatus:
        return self._call(self.aio.status())

    def node_urls(self) -> list[str]:
        return self._call(self.aio.node_urls())

    def wait(
        self, task_ids: Iterable[str], timeout_s: float, progress: Progress | None = None
    ) -> dict[str, TaskResult]:
        return self._call(self.aio.wait(list(task_ids), timeout_s, progress))

    def start_wait(
        self, task_ids: Iterable[str], timeout_s: float, progress: Progress | None = None
    ) -> Future[dict[str, TaskResult]]:
        """:meth:`wait` without blocking: the future resolves (or raises) when it would
        return; ``cancel()`` stops waiting."""
        return asyncio.run_coroutine_threadsafe(
            self.aio.wait(list(task_ids), timeout_s, progress), self._loop
        )

    def run(
        self, tasks: Sequence[TaskRequest], timeout_s: float, progress: Progress | None = None
    ) -> list[TaskResult]:
        return self._call(self.aio.run(tasks, timeout_s, progress))

    def close(self) -> None:
        """Cancel what still runs on the loop (a :meth:`start_wait`, a call Ctrl-C left),
        close the connections, then stop the loop: a task left pending there would be
        destroyed with the loop ("Task was destroyed but it is pending!")."""
        if self._loop.is_closed():
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    async def _shutdown(self) -> None:
        here = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not here]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self.aio.aclose()
        await asyncio.get_running_loop().shutdown_asyncgens()

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            raise


async def _make(url: str, **options: Any) -> AsyncRolloutClient:
    """Built on the loop thread, so its connection pool belongs to that loop."""
    return AsyncRolloutClient(url, **options)
