"""Node liveness: registration, heartbeats, draining, and losing a node (its unfinished
sessions end ERROR, so a task always completes)."""

from __future__ import annotations

import asyncio
import logging

import httpx

from polar.logs import log_event
from polar.rollout.metrics import DEAD, DRAINED, DRAINING, HEALTHY, SILENT
from polar.rollout.nodes import NodeRecord
from polar.rollout.service_core import ServiceCore, failed_result
from polar.rollout.store import SessionRow
from polar.schemas.node import NodeReport, Registered
from polar.schemas.rollout import EventKind, NodeView
from polar.schemas.task import (
    SessionStatus,
)

log = logging.getLogger("polar.rollout")


class NodeLiveness(ServiceCore):
    """Nodes joining, reporting, draining and going silent (part of the rollout service)."""

    # -- nodes ---------------------------------------------------------------------------

    async def register(self, report: NodeReport, credential: str | None = None) -> Registered:
        """A node (re)started: sessions it acknowledged but no longer holds are lost.
        ``credential`` is what the server calls the node with (and the node's answer)."""
        record = self.nodes.register(report.status)
        record.credential = credential
        for row in await asyncio.to_thread(self.store.unfinished_on, record.node_id):
            if row.acknowledged and row.session_id not in report.sessions:
                await self.accept_result(
                    failed_result(
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
            await self.accept_result(failed_result(row, node_id, error, why))

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
