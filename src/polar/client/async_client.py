"""The rollout server's typed client (asyncio): submit tasks, follow their events, read results.

Every consumer of the rollout server (the CLI, the quickstart, the trainers' bridges, tests)
goes through this client, so a trainer in another process or on another machine sees exactly
what an in-process one sees. Waiting follows the server's ``/events`` stream (reconnecting with
``Last-Event-ID``) instead of polling; finished results are read once, when a task completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import httpx
import orjson
from httpx_sse import SSEError, aconnect_sse
from pydantic import BaseModel, TypeAdapter, ValidationError

from polar.delivery import Outcome, RetryPolicy, deliver, outcome_of
from polar.errors import PolarError, RolloutTimeout
from polar.schemas.rollout import (
    EventKind,
    NodeView,
    RolloutEvent,
    ServerStatus,
    SessionView,
    TaskSummary,
)
from polar.schemas.task import TaskRequest, TaskResult

ModelT = TypeVar("ModelT", bound=BaseModel)

# Reads and submissions ride out a dropped connection or a restarting server for this long.
DEFAULT_RETRY = RetryPolicy(initial_s=0.1, max_s=2.0, deadline_s=30.0)
# While waiting for results (a wait has its own deadline), a server that answers nothing for a
# while is more likely busy than gone: an in-process server on 2 loaded cores was seen silent for
# over 30 s in the middle of an hour-long training run, which one unanswered read then ended.
WAIT_RETRY = RetryPolicy(initial_s=0.1, max_s=5.0, deadline_s=300.0)
# The server sends a keepalive every 15 s; a stream silent for longer than this is reconnected.
STREAM_IDLE_S = 40.0
# How often progress is re-read while sessions finish (one cheap summary per task).
PROGRESS_EVERY_S = 0.25

Progress = Callable[[int], None]


class RolloutError(PolarError):
    """The rollout server refused a request, or could not be reached in time."""


class AsyncRolloutClient:
    """Use as ``async with AsyncRolloutClient(url, token=...) as client``; without ``token``,
    ``$POLAR_ROLLOUT_TOKEN`` (so trainer bridges in another process need no code for it)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        token = token or os.environ.get("POLAR_ROLLOUT_TOKEN")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.retry = retry
        self.http = httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=timeout_s, transport=transport
        )

    async def __aenter__(self) -> AsyncRolloutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    # -- requests ------------------------------------------------------------------------

    async def submit(self, task: TaskRequest) -> TaskSummary:
        """Submit ``task``. Safe to retry: the server answers the same request again with the
        task it already has (running or finished); a different request under an existing id
        is a :class:`RolloutError` (409), never a replacement."""
        body = task.model_dump_json(exclude_unset=True)
        answer: httpx.Response | None = None

        async def attempt() -> Outcome:
            nonlocal answer
            answer = await self.http.post(
                "/tasks", content=body, headers={"content-type": "application/json"}
            )
            return outcome_of(answer)

        outcome = await deliver(attempt, self.retry, what=f"submitting task {task.task_id!r}")
        if outcome is not Outcome.DELIVERED or answer is None:
            raise _refusal(answer, f"submitting task {task.task_id!r}", self.url)
        return TaskSummary.model_validate_json(answer.content)

    async def cancel(self, task_id: str) -> TaskSummary:
        """Cancel the task's unfinished sessions (``DELETE /tasks/{id}``; idempotent). They end
        ERROR with failure kind infra, reason ``cancelled``; those on a node once it reports."""
        answer: httpx.Response | None = None

        async def attempt() -> Outcome:
            nonlocal answer
            answer = await self.http.delete(f"/tasks/{task_id}")
            return outcome_of(answer)

        outcome = await deliver(attempt, self.retry, what=f"cancelling task {task_id!r}")
        if outcome is not Outcome.DELIVERED or answer is None:
            raise _refusal(answer, f"cancelling task {task_id!r}", self.url)
        return TaskSummary.model_validate_json(answer.content)

    async def summary(self, task_id: str, *, retry: RetryPolicy | None = None) -> TaskSummary:
        """Status and session counts: cheap, whatever the size of the results."""
        return await self._get(f"/tasks/{task_id}/summary", TaskSummary, retry)

    async def result(self, task_id: str, *, retry: RetryPolicy | None = None) -> TaskResult:
        """The task's status and every finished session's result, trajectories included."""
        return await self._get(f"/tasks/{task_id}", TaskResult, retry)

    async def tasks(self) -> list[TaskSummary]:
        return await self._get("/tasks", _TASKS)

    async def sessions(self, task_id: str) -> list[SessionView]:
        return await self._get(f"/tasks/{task_id}/sessions", _SESSIONS)

    async def nodes(self) -> list[NodeView]:
        return await self._get("/nodes", _NODES)

    async def status(self) -> ServerStatus:
        return await self._get("/status", ServerStatus)

    async def node_urls(self) -> list[str]:
        """The registered, live gateway nodes (to pause them around a weight update)."""
        return [n.url for n in await self.nodes() if n.url and not (n.dead or n.drained)]

    # -- events --------------------------------------------------------------------------

    async def events(
        self, task_id: str | None = None, *, after: int = 0
    ) -> AsyncIterator[RolloutEvent]:
        """Events as they happen (of one task, or all), for ever: a dropped stream is resumed
        after the last event seen, so none is lost while the server keeps it in its history."""
        async for event in self._stream(task_id, after):
            yield event

    async def _stream(
        self,
        task_id: str | None,
        after: int,
        on_connect: Callable[[], Awaitable[None]] | None = None,
        retry: RetryPolicy | None = None,
    ) -> AsyncIterator[RolloutEvent]:
        """Events after ``after``, resumed across drops; ``on_connect`` runs at every
        (re)connect, once the server has registered the subscription."""
        policy = retry or self.retry
        last = after
        params = {"task_id": task_id} if task_id else {}
        timeout = httpx.Timeout(self.http.timeout.connect, read=STREAM_IDLE_S)
        failures = 0
        while True:
            try:
                async with aconnect_sse(
                    self.http,
                    "GET",
                    "/events",
                    params=params,
                    headers={"last-event-id": str(last)},
                    timeout=timeout,
                ) as source:
                    if source.response.status_code != 200:
                        await source.response.aread()
                        raise _refusal(source.response, "following events", self.url)
                    failures = 0
                    if on_connect is not None:
                        await on_connect()
                    async for sse in source.aiter_sse():
                        # A comment (": keepalive") comes through as an empty "message".
                        if sse.data and sse.id and sse.event != "message":
                            event = _event(sse.id, sse.event, sse.data)
                            last = event.id
                            yield event
            except (httpx.TransportError, SSEError):
                failures += 1
                deadline = policy.deadline_s
                if deadline is not None and failures * policy.max_s > deadline:
                    raise RolloutError(
                        f"lost the event stream of {self.url} and could not resume it"
                    ) from None
                await asyncio.sleep(policy.delay(failures - 1))

    # -- waiting -------------------------------------------------------------------------

    async def wait(
        self,
        task_ids: Iterable[str],
        timeout_s: float,
        progress: Progress | None = None,
    ) -> dict[str, TaskResult]:
        """Follow events until every task is COMPLETED (all its sessions final); the results
        by task id. ``progress`` hears the number of finished sessions whenever it grows."""
        waiter = _Waiter(self, list(task_ids), progress)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter.run()
        except TimeoutError:
            raise RolloutTimeout(
                f"{len(waiter.pending)} task(s) unfinished after {timeout_s:.0f}s: "
                + ", ".join(sorted(waiter.pending)[:5])
            ) from None
        return waiter.done

    async def run(
        self, tasks: Sequence[TaskRequest], timeout_s: float, progress: Progress | None = None
    ) -> list[TaskResult]:
        """Submit ``tasks`` and wait for all of them; results in submission order."""
        for task in tasks:
            await self.submit(task)
        done = await self.wait([t.task_id for t in tasks], timeout_s, progress)
        return [done[t.task_id] for t in tasks]

    # -- internals -----------------------------------------------------------------------

    async def _get(
        self,
        path: str,
        model: type[ModelT] | TypeAdapter[Any],
        retry: RetryPolicy | None = None,
    ) -> Any:
        answer: httpx.Response | None = None

        async def attempt() -> Outcome:
            nonlocal answer
            answer = await self.http.get(path)
            return outcome_of(answer)

        outcome = await deliver(attempt, retry or self.retry, what=f"GET {path}")
        if outcome is not Outcome.DELIVERED or answer is None:
            raise _refusal(answer, f"reading {path}", self.url)
        if isinstance(model, TypeAdapter):
            return model.validate_json(answer.content)
        return model.model_validate_json(answer.content)


class _Waiter:
    """Follows the event stream for a set of tasks; on every (re)connect it re-reads their
    summaries, so a task that finished before the stream opened, or while it was down and
    beyond the server's event history, is still seen."""

    def __init__(self, client: AsyncRolloutClient, task_ids: list[str], progress: Progress | None):
        self.client = client
        self.retry = _patient(client.retry)
        self.pending = set(task_ids)
        self.done: dict[str, TaskResult] = {}
        self.progress = progress
        self.finished: dict[str, int] = dict.fromkeys(task_ids, 0)
        self.reported = 0
        self.dirty: set[str] = set()
        self.refreshed_at = 0.0

    async def run(self) -> None:
        if not self.pending:
            return
        stream = self.client._stream(None, 0, self.settle, self.retry)
        try:
            async for event in stream:
                task_id = event.task_id
                if task_id not in self.pending:
                    continue
                if event.kind is EventKind.TASK_COMPLETED:
                    await self.complete(task_id)
                elif event.kind is EventKind.SESSION_FINISHED:
                    self.dirty.add(task_id)
                    await self.refresh(force=False)
                if not self.pending:
                    return
        except _AllDone:
            return
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]

    async def settle(self) -> None:
        """Catch up from summaries (the stream just (re)opened)."""
        self.dirty |= self.pending
        await self.refresh(force=True)
        if not self.pending:
            raise _AllDone

    async def refresh(self, *, force: bool) -> None:
        if not force and time.monotonic() - self.refreshed_at < PROGRESS_EVERY_S:
            return
        self.refreshed_at = time.monotonic()
        for task_id in sorted(self.dirty & self.pending):
            summary = await self.client.summary(task_id, retry=self.retry)
            self.finished[task_id] = summary.finished_sessions
            if summary.status.final:
                await self.complete(task_id)
        self.dirty.clear()
        self.report()

    async def complete(self, task_id: str) -> None:
        result = await self.client.result(task_id, retry=self.retry)
        self.done[task_id] = result
        self.pending.discard(task_id)
        self.finished[task_id] = len(result.results)
        self.report()

    def report(self) -> None:
        total = sum(self.finished.values())
        if self.progress is not None and total > self.reported:
            self.reported = total
            self.progress(total)


def _patient(policy: RetryPolicy) -> RetryPolicy:
    """The client's policy, or :data:`WAIT_RETRY` where that waits longer."""
    if policy.deadline_s is None or policy.deadline_s >= (WAIT_RETRY.deadline_s or 0):
        return policy
    return WAIT_RETRY


class _AllDone(Exception):
    """Raised from a (re)connect when the summaries show nothing left to wait for."""


def _event(event_id: str, kind: str, data: str) -> RolloutEvent:
    try:
        return RolloutEvent.model_validate({"id": event_id, "kind": kind, "data": _json(data)})
    except ValidationError as exc:
        raise RolloutError(f"malformed event {event_id} ({kind}): {exc}") from exc


def _json(data: str) -> Any:
    return orjson.loads(data) if data else {}


def _refusal(answer: httpx.Response | None, doing: str, url: str) -> RolloutError:
    if answer is None:
        return RolloutError(f"cannot reach the rollout server at {url} ({doing})")
    try:
        detail = answer.json().get("detail", answer.text)
    except ValueError:
        detail = answer.text
    hint = ""
    if answer.status_code == 401:
        hint = (
            " (send the server's admin token: token=..., `polar submit --token`, or "
            "POLAR_ROLLOUT_TOKEN; a server made one at first start in <data_dir>/rollout.token)"
        )
    return RolloutError(
        f"rollout server answered HTTP {answer.status_code} {doing}: {detail}{hint}"
    )


_TASKS: TypeAdapter[list[TaskSummary]] = TypeAdapter(list[TaskSummary])
_SESSIONS: TypeAdapter[list[SessionView]] = TypeAdapter(list[SessionView])
_NODES: TypeAdapter[list[NodeView]] = TypeAdapter(list[NodeView])
