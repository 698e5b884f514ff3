"""The rollout service: tasks in, sessions dispatched over nodes, results and callbacks out.

The HTTP routes in ``app.py`` are a thin shell around this class. Invariants it keeps:

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
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
from starlette.responses import Response

from polar.delivery import Outcome, deliver
from polar.errors import CallbackRefused, TaskRefused
from polar.logs import log_event
from polar.rollout.access import Access
from polar.rollout.activity import Activity
from polar.rollout.callbacks import CallbackSender
from polar.rollout.config import RolloutServerConfig
from polar.rollout.events import EventBus
from polar.rollout.metrics import DEAD, DRAINED, DRAINING, HEALTHY, SILENT, RolloutMetrics
from polar.rollout.node_provider import NodeProvider, StaticProvider
from polar.rollout.nodes import NodeRecord, NodeRegistry
from polar.rollout.scheduler import choose_node
from polar.rollout.store import RolloutStore, SessionRow, TaskRow
from polar.schemas.ids import new_session_id
from polar.schemas.node import NodeReport, NodeSessionInfo, Registered, SessionDispatch
from polar.schemas.rollout import CallbackState, EventKind, NodeView, SessionView, TaskSummary
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

_DISPATCH_BATCH = 512
CANCELLED = "cancelled"
# A node's ERROR result that names no failure (a node older than the field): scored as before.
UNSPECIFIED = SessionFailure(kind="agent", reason="unspecified")


class RolloutService:
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
                await self.accept_result(_failed(row, row.node_id, CANCELLED, CANCELLED))
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

    # -- nodes ---------------------------------------------------------------------------

    async def register(self, report: NodeReport, credential: str | None = None) -> Registered:
        """A node (re)started: sessions it acknowledged but no longer holds are lost.
        ``credential`` is what the server calls the node with (and the node's answer)."""
        record = self.nodes.register(report.status)
        record.credential = credential
        for row in await asyncio.to_thread(self.store.unfinished_on, record.node_id):
            if row.acknowledged and row.session_id not in report.sessions:
                await self.accept_result(
                    _failed(
                        row,
                        record.node_id,
                        f"node {record.node_id} restarted and lost it",
                        "node_restarted",
                    )
                )
        retired = await self._note_statuses(record.node_id, report.sessions)
        self.events.publish(EventKind.NODE_REGISTERED, node_id=record.node_id, url=record.url)
        log_event(
            log,
            "node.registered",
            f"node {record.node_id} registered at {record.url}",
            node_id=record.node_id,
            url=record.url,
        )
        self.wake()
        return Registered(
            node_id=record.node_id,
            heartbeat_s=self._heartbeat_s(),
            credential=credential,
            retired=retired,
        )

    async def heartbeat(self, report: NodeReport) -> Registered | None:
        """``None`` when the node must register again (unknown, or declared dead)."""
        record = self.nodes.heartbeat(report.status)
        if record is None:
            return None
        retired = await self._note_statuses(record.node_id, report.sessions)
        if record.load is not None and record.load.eligible:
            self.wake()
        return Registered(node_id=record.node_id, heartbeat_s=self._heartbeat_s(), retired=retired)

    async def drain(self, node_id: str, deadline_s: float | None = None) -> NodeRecord | None:
        """Stop scheduling to a node and ask it to drain (it finishes what it has); with
        ``deadline_s``, what it still has then is failed as infra (the node stops it)."""
        record = self.nodes.drain(node_id)
        if record is None:
            return None
        if deadline_s is not None:
            earlier = self._deadlines.pop(node_id, None)
            if earlier is not None:
                earlier.cancel()
            self._deadlines[node_id] = asyncio.create_task(
                self._drain_deadline(node_id, deadline_s), name=f"drain-deadline-{node_id}"
            )
        if record.url:
            try:
                await self.client.post(
                    f"{record.url}/polar/node/drain", headers=self._node_headers(node_id), timeout=5
                )
            except httpx.HTTPError as exc:
                log_event(
                    log,
                    "node.drain_failed",
                    f"could not tell node {node_id} to drain: {exc!r}",
                    level=logging.WARNING,
                    node_id=node_id,
                    error=repr(exc),
                )
        self.events.publish(EventKind.NODE_DRAINING, node_id=node_id)
        log_event(log, "node.draining", f"node {node_id} draining", node_id=node_id)
        return record

    def node_views(self) -> list[NodeView]:
        views = []
        now = self.nodes.clock()
        for record in self.nodes.all():
            status = record.status
            views.append(
                NodeView(
                    node_id=record.node_id,
                    url=record.url,
                    healthy=self.nodes.healthy(record),
                    draining=record.draining,
                    dead=record.dead and not record.drained,
                    drained=record.drained,
                    seen_s_ago=round(now - record.last_seen, 3),
                    capacity=status.capacity if status else 0,
                    stages=status.stages.model_dump() if status else {},
                    workers=status.workers.model_dump() if status else {},
                    paused=status.paused if status else False,
                    policy_version=status.policy_version if status else 0,
                )
            )
        return views

    def _heartbeat_s(self) -> float:
        return max(0.05, self.config.heartbeat_timeout_s / 3)

    async def _note_statuses(self, node_id: str, sessions: dict[str, SessionStatus]) -> list[str]:
        """Record the progress a node reports of its own unfinished sessions. Those this server
        finished without it (it was declared dead) or bound to another node are returned: the
        node closes them. Ids the server never issued are left alone (dispatched by hand)."""
        if not sessions:
            return []
        bound = await asyncio.to_thread(self.store.bindings, list(sessions))
        held = {
            sid for sid, (node, status) in bound.items() if node == node_id and not status.finished
        }
        changed = {
            sid: status
            for sid, status in sessions.items()
            if sid in held and not status.finished and self._known_status.get(sid) != status
        }
        retired = [sid for sid in bound if sid not in held]
        if not changed:
            return retired

        def write() -> None:
            for sid, status in changed.items():
                self.store.set_status(sid, status)

        await asyncio.to_thread(write)
        self._known_status.update(changed)
        return retired

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

    # -- dispatch ------------------------------------------------------------------------

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _dispatch_loop(self) -> None:
        assert self._wake is not None
        while True:
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.dispatch_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.dispatch_once()
            except Exception as exc:
                log_event(
                    log,
                    "rollout.dispatch_round_failed",
                    "dispatch round failed",
                    level=logging.ERROR,
                    exc_info=True,
                    error=repr(exc),
                )

    async def dispatch_once(self) -> int:
        """Bind queued sessions to nodes (least pressure first) and start sending them."""
        loads = self.nodes.loads()
        free = sum(load.capacity for load in loads if load.eligible)
        if free <= 0:
            return 0
        rows = await asyncio.to_thread(self.store.unassigned, min(free, _DISPATCH_BATCH))
        plan: list[tuple[SessionRow, str]] = []
        for row in rows:
            node = choose_node(loads)
            if node is None:
                break
            node.assign()
            plan.append((row, node.node_id))
        if not plan:
            return 0

        def bind() -> list[tuple[SessionRow, str]]:
            # A session cancelled since it was read is not bound, nor sent.
            return [(row, node) for row, node in plan if self.store.assign(row.session_id, node)]

        bound = await asyncio.to_thread(bind)
        for row, node_id in bound:
            self._send(row, node_id)
        return len(bound)

    def _send(self, row: SessionRow, node_id: str) -> None:
        if row.session_id in self._sending:
            return
        task = asyncio.create_task(self._send_until_acknowledged(row, node_id))
        self._sending[row.session_id] = task
        task.add_done_callback(lambda _: self._sending.pop(row.session_id, None))

    async def _send_until_acknowledged(self, row: SessionRow, node_id: str) -> None:
        """POST the dispatch to its node until it answers: only that node, for as long as it
        lives (the liveness loop fails the sessions of a node that dies)."""
        what = f"dispatch of {row.session_id} to {node_id}"
        # No deadline: the node's liveness, not a timer, decides when to stop.
        policy = self.config.dispatch_retry.model_copy(update={"deadline_s": None})

        def node_gone() -> bool:
            record = self.nodes.get(node_id)
            return record is None or record.dead

        try:
            body = SessionDispatch(
                session_id=row.session_id,
                sample_index=row.sample_index,
                task=self._request(row.task_id),
            ).model_dump_json()
            attempt = partial(self._post_dispatch, row, node_id, body, policy.timeout_s)
            await deliver(attempt, policy, what=what, give_up_if=node_gone)
        except Exception as exc:
            # A bug or a garbled answer, not the network: retrying would repeat it for as long
            # as the node lives, so fail the session and let its task complete.
            log_event(
                log,
                "session.dispatch_failed",
                f"{what} broke; failing the session",
                level=logging.ERROR,
                exc_info=True,
                session_id=row.session_id,
                task_id=row.task_id,
                node_id=node_id,
                error=repr(exc),
            )
            self.metrics.dispatch_attempts.labels("error").inc()
            await self.accept_result(
                _failed(row, node_id, f"{what} failed: {exc!r}", "dispatch_failed")
            )

    async def _post_dispatch(
        self, row: SessionRow, node_id: str, body: str, timeout_s: float
    ) -> Outcome:
        record = self.nodes.get(node_id)
        if record is None or record.url is None:
            return Outcome.RETRY  # owed results after a restart, not registered again yet
        headers = {**self._node_headers(node_id), "content-type": "application/json"}
        started = time.perf_counter()
        try:
            reply = await self.client.post(
                f"{record.url}/polar/node/sessions",
                content=body,
                headers=headers,
                timeout=timeout_s,
            )
        except httpx.TransportError:
            self.metrics.dispatch_attempts.labels(Outcome.RETRY.value).inc()
            raise
        self.metrics.dispatch_seconds.observe(time.perf_counter() - started)
        outcome = await self._dispatch_answered(row, node_id, reply)
        self.metrics.dispatch_attempts.labels(outcome.value).inc()
        return outcome

    async def _dispatch_answered(
        self, row: SessionRow, node_id: str, reply: httpx.Response
    ) -> Outcome:
        """What a node's answer to a dispatch means, and its effects."""
        if reply.status_code in (200, 201):
            info = NodeSessionInfo.model_validate_json(reply.content)
            await asyncio.to_thread(self.store.acknowledge, row.session_id, info.status)
            self.events.publish(
                EventKind.SESSION_DISPATCHED,
                task_id=row.task_id,
                session_id=row.session_id,
                node_id=node_id,
            )
            log_event(
                log,
                "session.dispatched",
                f"session {row.session_id} dispatched to node {node_id}",
                session_id=row.session_id,
                task_id=row.task_id,
                node_id=node_id,
            )
            return Outcome.DELIVERED
        if reply.status_code in (429, 503):
            await asyncio.to_thread(self.store.unassign, row.session_id)
            log_event(
                log,
                "session.requeued",
                f"node {node_id} refused session {row.session_id} (HTTP {reply.status_code});"
                " it waits for a node again",
                session_id=row.session_id,
                task_id=row.task_id,
                node_id=node_id,
                http_status=reply.status_code,
            )
            self.wake()
            return Outcome.REFUSED
        if reply.status_code >= 500:
            return Outcome.RETRY
        error = f"node {node_id} rejected the session: HTTP {reply.status_code}"
        log_event(
            log,
            "session.rejected",
            error,
            level=logging.WARNING,
            session_id=row.session_id,
            task_id=row.task_id,
            node_id=node_id,
            http_status=reply.status_code,
            error=error,
        )
        await self.accept_result(_failed(row, node_id, error, "dispatch_rejected"))
        return Outcome.REJECTED

    def _node_headers(self, node_id: str) -> dict[str, str]:
        """The node's own credential (or its admin token from the topology); never the
        server's admin token, which a node has no business holding."""
        record = self.nodes.get(node_id)
        token = self.config.node_tokens.get(node_id) or (record.credential if record else None)
        return {"authorization": f"Bearer {token}"} if token else {}

    # -- liveness ------------------------------------------------------------------------

    async def _liveness_loop(self) -> None:
        interval = min(0.5, self.config.node_grace_s / 4)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.expire_nodes()
            except Exception as exc:
                log_event(
                    log,
                    "rollout.liveness_round_failed",
                    "liveness round failed",
                    level=logging.ERROR,
                    exc_info=True,
                    error=repr(exc),
                )

    async def expire_nodes(self) -> list[str]:
        """Fail the unfinished sessions of nodes silent past their grace period. A draining
        node that went silent owing nothing was stopped once drained: drained, not dead."""
        dead = self.nodes.expire()
        for node_id in dead:
            rows = await asyncio.to_thread(self.store.unfinished_on, node_id)
            record = self.nodes.get(node_id)
            if record is not None and record.draining and not rows:
                record.drained = True
                self._log_drained(node_id)
                continue
            reason = (
                f"node {node_id} sent no heartbeat for {self.config.node_grace_s:g}s;"
                " its sessions are lost"
            )
            await self._lose_node(node_id, rows, reason, "node_dead", cause=reason)
        return dead

    async def node_lost(self, node_id: str, reason: str) -> int | None:
        """A node's loss was observed (Ray saw it die, an operator says so): fail its unfinished
        sessions now, as infra, instead of after ``node_grace_s``. ``None``: no such node."""
        known = self.nodes.get(node_id) is not None
        newly_dead = self.nodes.declare_dead(node_id)
        rows = await asyncio.to_thread(self.store.unfinished_on, node_id)
        if not known and not rows:
            return None
        error = f"node {node_id} lost ({reason}); its sessions are lost"
        await self._lose_node(node_id, rows, error, "node_lost", cause=reason, dead=newly_dead)
        return len(rows)

    async def forget_credential(self, node_id: str) -> None:
        """Revoke ``node_id``'s credential for its provider, which is replacing a gateway gone
        for good (as ``DELETE /nodes/{id}`` does for an operator)."""
        if await asyncio.to_thread(self.access.retire, node_id):
            log.warning("node id %r: credential revoked for its replacement gateway", node_id)

    async def node_retired(self, node_id: str) -> None:
        """A draining node's gateway was stopped on purpose (its provider retired it): the node
        is drained now, not dead after ``node_grace_s``. What it still owed (past a drain
        deadline) fails as infra ``drain_deadline``."""
        if not self.nodes.declare_dead(node_id, drained=True):
            return
        rows = await asyncio.to_thread(self.store.unfinished_on, node_id)
        error = f"node {node_id} drained: its gateway stopped with the session unfinished"
        await self._fail_all(rows, node_id, error, "drain_deadline")
        self._log_drained(node_id, failed_sessions=len(rows))

    def _log_drained(self, node_id: str, failed_sessions: int = 0) -> None:
        log_event(
            log,
            "node.drained",
            f"node {node_id} drained and stopped",
            node_id=node_id,
            failed_sessions=failed_sessions,
        )

    async def _lose_node(
        self,
        node_id: str,
        rows: list[SessionRow],
        error: str,
        why: str,
        *,
        cause: str,
        dead: bool = True,
    ) -> None:
        """Fail a node's unfinished ``rows`` (infra ``why``), announce its death (``dead``: the
        first time it is declared) and log ``node.<dead|lost>``."""
        await self._fail_all(rows, node_id, error, why)
        if dead:
            self.events.publish(EventKind.NODE_DEAD, node_id=node_id, failed_sessions=len(rows))
        log_event(
            log,
            "node." + why.removeprefix("node_"),
            f"{error} ({len(rows)} sessions failed)",
            level=logging.WARNING,
            node_id=node_id,
            failed_sessions=len(rows),
            error=cause,
        )

    async def _drain_deadline(self, node_id: str, deadline_s: float) -> None:
        await asyncio.sleep(deadline_s)
        self._deadlines.pop(node_id, None)
        rows = await asyncio.to_thread(self.store.unfinished_on, node_id)
        error = f"node {node_id} drained: still running at the {deadline_s:g}s deadline"
        # The node learns from its next heartbeat's answer that these are over and stops them.
        await self._fail_all(rows, node_id, error, "drain_deadline")
        log_event(
            log,
            "node.drain_deadline",
            f"{error} ({len(rows)} sessions cancelled)",
            node_id=node_id,
            failed_sessions=len(rows),
        )

    def unfinished_on(self, node_id: str) -> int:
        """Sessions ``node_id`` still owes (blocking: SQLite)."""
        return len(self.store.unfinished_on(node_id))

    async def _fail_all(self, rows: list[SessionRow], node_id: str, error: str, why: str) -> None:
        for row in rows:
            await self.accept_result(_failed(row, node_id, error, why))

    def node_state(self, record: NodeRecord) -> str:
        """healthy, draining, drained (and stopped), silent (missed heartbeats, not yet dead)
        or dead."""
        if record.drained:
            return DRAINED
        if record.dead:
            return DEAD
        if not self.nodes.healthy(record):
            return SILENT
        return DRAINING if record.draining else HEALTHY

    async def metrics_response(self) -> Response:
        """The Prometheus scrape: counters as they stand, state gauges read now."""
        counts = await asyncio.to_thread(self.store.counts)
        nodes = [(record, self.node_state(record)) for record in self.nodes.all()]
        return self.metrics.response(counts, nodes)

    def status(self) -> dict[str, Any]:
        tasks = self.store.tasks()
        return {
            "nodes": [v.model_dump() for v in self.node_views()],
            "tasks": {
                "running": sum(1 for t in tasks if t.status == TaskStatus.RUNNING),
                "total": len(tasks),
            },
            "sessions": self.store.counts(),
            "dispatching": len(self._sending),
            "callbacks_in_flight": self.callbacks.pending,
            "event_subscribers": self.events.subscribers,
        }


def callback_host_allowed(url: str, hosts: list[str]) -> bool:
    """Whether ``url`` is http(s) to one of ``hosts`` (exact names; no wildcards)."""
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and (parts.hostname or "") in {
        h.strip("[]").lower() for h in hosts
    }


def _failed(row: SessionRow, node_id: str | None, error: str, reason: str) -> SessionResult:
    """A session this server ends itself: the infrastructure failed it, not the policy."""
    return SessionResult(
        session_id=row.session_id,
        task_id=row.task_id,
        status=SessionStatus.ERROR,
        node_id=node_id,
        error=error,
        failure=SessionFailure(kind="infra", reason=reason),
        metadata={"sample_index": row.sample_index},
    )


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
