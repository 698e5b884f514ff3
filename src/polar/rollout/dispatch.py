"""Dispatch: unassigned sessions bound to a node (the scheduler's choice), sent until the
node acknowledges, and re-sent only to that node, so a lost acknowledgement never starts a
session twice; a node that refuses gives the session back to the queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from functools import partial

import httpx

from polar.delivery import Outcome, deliver
from polar.logs import log_event
from polar.rollout.scheduler import choose_node
from polar.rollout.service_core import ServiceCore, failed_result
from polar.rollout.store import SessionRow
from polar.schemas.node import NodeSessionInfo, SessionDispatch
from polar.schemas.rollout import EventKind

log = logging.getLogger("polar.rollout")

_DISPATCH_BATCH = 512
# Dispatch POSTs in flight at once, over all nodes. httpx's pool walks every queued request at
# each request's start and end (quadratic in what is queued): 1,000 sessions sent at once to a
# healthy node kept the server's loop 91% in that walk, /status went unanswered for 20 s and the
# node's heartbeats timed out (bench/rollout_scale.py). A retry's backoff holds no slot.
DISPATCH_IN_FLIGHT = 64


class Dispatch(ServiceCore):
    """The dispatch loop and the send to one node (part of the rollout service)."""

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
                failed_result(row, node_id, f"{what} failed: {exc!r}", "dispatch_failed")
            )

    async def _post_dispatch(
        self, row: SessionRow, node_id: str, body: str, timeout_s: float
    ) -> Outcome:
        record = self.nodes.get(node_id)
        if record is None or record.url is None:
            return Outcome.RETRY  # owed results after a restart, not registered again yet
        headers = {**self._node_headers(node_id), "content-type": "application/json"}
        async with self._dispatch_slots:
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
        await self.accept_result(failed_result(row, node_id, error, "dispatch_rejected"))
        return Outcome.REJECTED

    def _node_headers(self, node_id: str) -> dict[str, str]:
        """The node's own credential (or its admin token from the topology); never the
        server's admin token, which a node has no business holding."""
        record = self.nodes.get(node_id)
        token = self.config.node_tokens.get(node_id) or (record.credential if record else None)
        return {"authorization": f"Bearer {token}"} if token else {}
