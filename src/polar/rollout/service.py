"""The rollout service: tasks in, sessions dispatched over nodes, results and callbacks out.

The HTTP routes in ``app.py`` are a thin shell around this class. It is the task lifecycle
(submit, cancel, results, callbacks) joined with :class:`~polar.rollout.dispatch.Dispatch` and
:class:`~polar.rollout.liveness.NodeLiveness`, over the state in
:class:`~polar.rollout.service_core.ServiceCore`. Invariants it keeps:

- a session is bound to one node before it is sent, and re-sent only to that node, so a lost
  acknowledgement is retried against the node's idempotent dispatch and never starts it twice;
- a node that refuses (full, draining) gives the session back to the queue;
- a node silent past its grace period has its unfinished sessions marked ERROR, so a task always
  completes;
- a session's first final result wins; it is written to SQLite and the task's JSONL before the
  node's delivery is acknowledged.

What happens to each task and session is also a log event with its ids (``task.submitted``,
``session.registered``, ``session.dispatched``, ``session.result``, ``task.completed``, ...; see
docs/observability.md#logs).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import orjson
from starlette.responses import Response

from polar.errors import CallbackRefused, TaskRefused
from polar.logs import log_event
from polar.rollout.access import Access
from polar.rollout.activity import Activity
from polar.rollout.callbacks import CallbackSender
from polar.rollout.config import RolloutServerConfig
from polar.rollout.dispatch import DISPATCH_IN_FLIGHT, Dispatch
from polar.rollout.events import EventBus
from polar.rollout.liveness import NodeLiveness
from polar.rollout.metrics import RolloutMetrics
from polar.rollout.node_provider import NodeProvider, StaticProvider
from polar.rollout.nodes import NodeRegistry
from polar.rollout.service_core import failed_result
from polar.rollout.store import RolloutStore, SessionRow, TaskRow
from polar.schemas.ids import new_session_id
from polar.schemas.rollout import (
    CallbackState,
    EventKind,
    ServerStatus,
    SessionView,
    TaskCounts,
    TaskSummary,
)
from polar.schemas.task import (
    SessionFailure,
    SessionResult,
    SessionStatus,
    TaskRequest,
    TaskResult,
    TaskStatus,
    settle_failure,
)
from polar.tokens import admin_token

log = logging.getLogger("polar.rollout")

CANCELLED = "cancelled"
# A node's ERROR result that names no failure (a node older than the field): scored as before.
UNSPECIFIED = SessionFailure(kind="agent", reason="unspecified")


class RolloutService(Dispatch, NodeLiveness):
    """Owns the store, the node registry, the dispatch and liveness loops, and callbacks."""

    def __init__(
        self,
        config: RolloutServerConfig,
        *,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.monotonic,
        provider: NodeProvider | None = None,
    ) -> None:
        self.config = config
        self.provider: NodeProvider = provider or StaticProvider()
        self.store = RolloutStore(self.config.data_dir)
        token = admin_token(
            host=config.host,
            auth=config.auth,
            configured=config.admin_token,
            token_file=config.token_file(),
            what="rollout server",
            how="the server then makes an admin token (or set rollout.admin_token).",
        )
        self.access = Access(self.store, token, config.enrolment_secret)
        self.nodes = NodeRegistry(
            self.config.heartbeat_timeout_s,
            self.config.node_grace_s,
            clock,
            forget_s=self.config.forget_nodes_s,
        )
        self.events = EventBus()
        self.metrics = RolloutMetrics()
        self.activity = Activity()
        self.client = client or httpx.AsyncClient()
        self.callbacks = CallbackSender(
            self.store,
            self.config.callback_retry,
            self.client,
            on_done=self._callback_done,
            on_retry=self.metrics.callback_retries.inc,
        )
        self._requests: dict[str, TaskRequest] = {}
        self._sending: dict[str, asyncio.Task[None]] = {}
        self._dispatch_slots = asyncio.Semaphore(DISPATCH_IN_FLIGHT)
        self._known_status: dict[str, SessionStatus] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._deadlines: dict[str, asyncio.Task[None]] = {}
        self._wake: asyncio.Event | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Resume where a previous server left off, then start the loops."""
        self._wake = asyncio.Event()
        for node_id in await asyncio.to_thread(self.store.nodes_owing_results):
            self.nodes.expect(node_id)
        for row in await asyncio.to_thread(self.store.unacknowledged):
            self._send(row, str(row.node_id))
        for row in await asyncio.to_thread(self.store.pending_callbacks):
            url = self._request(row.task_id).callback_url
            if url and row.result is not None:
                if callback_host_allowed(url, self.config.callback_hosts):
                    self.callbacks.send(url, row.result)
                else:
                    log_event(
                        log,
                        "session.callback_refused",
                        f"callback to {url} not sent: not in rollout.callback_hosts",
                        level=logging.WARNING,
                        session_id=row.session_id,
                        task_id=row.task_id,
                        node_id=row.node_id,
                        url=url,
                        error="callback host not in rollout.callback_hosts",
                    )
        self._loops = [
            asyncio.create_task(self._dispatch_loop(), name="rollout-dispatch"),
            asyncio.create_task(self._liveness_loop(), name="rollout-liveness"),
        ]
        await self.provider.start(self)

    async def stop(self) -> None:
        await self.provider.stop()
        tasks = self._loops + list(self._sending.values()) + list(self._deadlines.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.callbacks.aclose()
        self.events.close()
        await self.client.aclose()
        self.store.close()

    # -- tasks ---------------------------------------------------------------------------

    async def submit(self, request: TaskRequest) -> tuple[TaskSummary, bool]:
        """Expand a task into sessions, and whether it is new: the same request again (a retry)
        answers the task that has its id, running or finished. Raises ``TaskConflict`` if a
        different request has that id, ``CallbackRefused`` if its callback_url names a host
        not in ``callback_hosts``."""
        url = request.callback_url
        if url and not callback_host_allowed(url, self.config.callback_hosts):
            raise CallbackRefused(
                f"callback_url {url!r} names a host not in rollout.callback_hosts "
                f"({', '.join(self.config.callback_hosts) or 'none'}); add its host there"
            )
        default_runtime = self.config.default_runtime
        if default_runtime and "kind" not in request.runtime.model_fields_set:
            request = request.model_copy(
                update={"runtime": request.runtime.model_copy(update={"kind": default_runtime})}
            )
        refusal = self.provider.refuse(request)
        if refusal is not None:
            raise TaskRefused(refusal)
        session_ids = [new_session_id() for _ in range(request.num_samples)]
        if not await asyncio.to_thread(self.store.create_task, request, session_ids):
            log_event(
                log,
                "task.resubmitted",
                f"task {request.task_id} submitted again with the same request; it stands",
                task_id=request.task_id,
            )
            existing = self.summary(request.task_id)
            assert existing is not None
            return existing, False
        self._requests[request.task_id] = request
        self.metrics.tasks_submitted.inc()
        self.events.publish(
            EventKind.TASK_SUBMITTED, task_id=request.task_id, num_samples=request.num_samples
        )
        log_event(
            log,
            "task.submitted",
            f"task {request.task_id} submitted ({request.num_samples} samples)",
            task_id=request.task_id,
            num_samples=request.num_samples,
        )
        for index, session_id in enumerate(session_ids):
            log_event(
                log,
                "session.registered",
                f"session {session_id} of task {request.task_id} registered",
                session_id=session_id,
                task_id=request.task_id,
                sample_index=index,
            )
        self.wake()
        summary = self.summary(request.task_id)
        assert summary is not None
        return summary, True

    async def cancel(self, task_id: str) -> TaskSummary | None:
        """Cancel a task's unfinished sessions (None: unknown task). A session a node holds is
        cancelled there, and the node reports it (ERROR, failure infra "cancelled", with what
        it captured); one no node holds, or whose node cannot be told, ends here at once.
        Idempotent: finished sessions are left as they are."""
        if await asyncio.to_thread(self.store.task, task_id) is None:
            return None
        rows = await asyncio.to_thread(self.store.sessions, task_id)
        unfinished = [r for r in rows if not r.status.finished]
        told = await asyncio.gather(*(self._cancel_on_node(r) for r in unfinished))
        for row, on_node in zip(unfinished, told, strict=True):
            if not on_node:
                await self.accept_result(failed_result(row, row.node_id, CANCELLED, CANCELLED))
        if unfinished:
            log_event(
                log,
                "task.cancelled",
                f"task {task_id} cancelled ({len(unfinished)} unfinished sessions)",
                task_id=task_id,
                cancelled_sessions=len(unfinished),
                on_nodes=sum(told),
            )
        return self.summary(task_id)

    async def _cancel_on_node(self, row: SessionRow) -> bool:
        """Ask the node holding ``row`` to cancel it; True if the node has it and will report
        its end. A dispatch still in flight is stopped first."""
        sending = self._sending.get(row.session_id)
        if sending is not None:
            sending.cancel()
        record = self.nodes.get(row.node_id) if row.node_id else None
        if record is None or record.url is None or record.dead or not row.acknowledged:
            if record is not None and record.url is not None and not record.dead:
                await self._delete_on_node(record.url, row)  # it may have it: stop it there
            return False
        return await self._delete_on_node(record.url, row)

    async def _delete_on_node(self, url: str, row: SessionRow) -> bool:
        assert row.node_id is not None
        try:
            reply = await self.client.delete(
                f"{url}/polar/node/sessions/{row.session_id}",
                headers=self._node_headers(row.node_id),
                timeout=5,
            )
        except httpx.HTTPError as exc:
            log_event(
                log,
                "session.cancel_failed",
                f"could not tell node {row.node_id} to cancel {row.session_id}: {exc!r};"
                " ending it here",
                level=logging.WARNING,
                session_id=row.session_id,
                task_id=row.task_id,
                node_id=row.node_id,
                error=repr(exc),
            )
            return False
        return reply.status_code == 200

    def summary(self, task_id: str) -> TaskSummary | None:
        row = self.store.task(task_id)
        return self._summary(row) if row else None

    def summaries(self) -> list[TaskSummary]:
        return [self._summary(row) for row in self.store.tasks()]

    def task_result_json(self, task_id: str) -> bytes | Path | None:
        """A :class:`TaskResult` as JSON, spliced from the stored result documents: answering
        costs a read, not a parse and re-serialization of every trajectory. A COMPLETED task
        never changes again, so its answer is written once and then served as a file (a
        ``Path``). Blocking: call it from a worker thread."""
        row = self.store.task(task_id)
        if row is None:
            return None
        answer = self.store.answer_path(task_id)
        if row.status.final and answer.exists():
            return answer
        head = orjson.dumps({"task_id": task_id, "status": row.status})[:-1]
        paths = orjson.dumps([str(self.store.results_path(task_id))])
        results = b",".join(self.store.result_blobs(task_id))
        body = head + b',"results":[' + results + b'],"result_paths":' + paths + b"}"
        if row.status.final:
            partial = answer.with_suffix(f".{threading.get_ident()}.tmp")
            partial.write_bytes(body)
            partial.replace(answer)
        return body

    def task_result(self, task_id: str) -> TaskResult | None:
        body = self.task_result_json(task_id)
        if isinstance(body, Path):
            body = body.read_bytes()
        return TaskResult.model_validate_json(body) if body is not None else None

    def session_views(self, task_id: str) -> list[SessionView]:
        return [_session_view(s) for s in self.store.sessions(task_id)]

    def _summary(self, row: TaskRow) -> TaskSummary:
        return TaskSummary(
            task_id=row.task_id,
            status=row.status,
            num_samples=row.request.num_samples,
            counts=self.store.counts(row.task_id),
            created_at=row.created_at,
            finished_at=row.finished_at,
        )

    def _request(self, task_id: str) -> TaskRequest:
        request = self._requests.get(task_id)
        if request is None:
            row = self.store.task(task_id)
            if row is None:
                raise KeyError(task_id)
            request = self._requests[task_id] = row.request
        return request

    # -- results -------------------------------------------------------------------------

    async def accept_result(self, result: SessionResult) -> bool:
        """Record a node's final result; ``False`` for a duplicate. Raises KeyError if unknown."""
        if not result.status.finished:
            raise ValueError(f"result for {result.session_id} has non-final status {result.status}")
        result = settle_failure(result, UNSPECIFIED)
        finished = await asyncio.to_thread(self.store.finish, result)
        if not finished.new:
            log_event(
                log,
                "session.result_duplicate",
                f"result of {result.session_id} again; the first one stands",
                level=logging.DEBUG,
                session_id=result.session_id,
                task_id=result.task_id,
                node_id=result.node_id,
            )
            return False
        self._known_status.pop(result.session_id, None)
        self.metrics.session_finished(result.status, result.timing)
        self.metrics.tokens_delivered(result.delivery)
        log_event(
            log,
            "session.result",
            f"session {result.session_id} of task {result.task_id}: {result.status.value}",
            session_id=result.session_id,
            task_id=result.task_id,
            node_id=result.node_id,
            status=result.status.value,
            reward=result.reward,
            error=result.error,
        )
        self.activity.record(result)
        self.events.publish(
            EventKind.SESSION_FINISHED,
            task_id=result.task_id,
            session_id=result.session_id,
            status=result.status.value,
            node_id=result.node_id,
            reward=result.reward,
            error=result.error,
        )
        if finished.callback_url:
            self.callbacks.send(finished.callback_url, result)
        if finished.task_completed:
            await self._task_completed(result.task_id)
            self.events.publish(EventKind.TASK_COMPLETED, task_id=result.task_id)
            log_event(
                log,
                "task.completed",
                f"task {result.task_id} completed",
                task_id=result.task_id,
            )
        return True

    async def _task_completed(self, task_id: str) -> None:
        self.metrics.tasks_completed.inc()
        row = await asyncio.to_thread(self.store.task, task_id)
        if row is not None and row.finished_at is not None:
            self.metrics.task_seconds.observe(max(0.0, row.finished_at - row.created_at))

    def _callback_done(self, session_id: str, state: CallbackState) -> None:
        self.metrics.callback_done(state == CallbackState.DELIVERED)
        self.events.publish(EventKind.CALLBACK, session_id=session_id, state=state)

    async def metrics_response(self) -> Response:
        """The Prometheus scrape: counters as they stand, state gauges read now."""
        counts = await asyncio.to_thread(self.store.counts)
        nodes = [(record, self.node_state(record)) for record in self.nodes.all()]
        return self.metrics.response(counts, nodes)

    def status(self) -> ServerStatus:
        """What ``GET /status`` answers (it reads the store: call it off the event loop)."""
        tasks = self.store.tasks()
        return ServerStatus(
            nodes=self.node_views(),
            tasks=TaskCounts(
                running=sum(1 for t in tasks if t.status == TaskStatus.RUNNING), total=len(tasks)
            ),
            sessions=self.store.counts(),
            dispatching=len(self._sending),
            callbacks_in_flight=self.callbacks.pending,
            event_subscribers=self.events.subscribers,
        )


def callback_host_allowed(url: str, hosts: list[str]) -> bool:
    """Whether ``url`` is http(s) to one of ``hosts`` (exact names; no wildcards)."""
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and (parts.hostname or "") in {
        h.strip("[]").lower() for h in hosts
    }


def _session_view(row: SessionRow) -> SessionView:
    result = row.result
    return SessionView(
        session_id=row.session_id,
        task_id=row.task_id,
        sample_index=row.sample_index,
        status=row.status,
        node_id=row.node_id,
        acknowledged=row.acknowledged,
        callback=row.callback,
        reward=result.reward if result else None,
        error=result.error if result else None,
    )
