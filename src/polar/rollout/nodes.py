"""The registry of gateway nodes: registration, heartbeats, draining, and declaring nodes dead.

A node that misses heartbeats for ``heartbeat_timeout_s`` stops getting sessions; one silent for
``grace_s`` is dead, and the server marks its unfinished sessions ERROR rather than let a task
hang. A node drained and then stopped is *drained*, not dead. A dead or drained node is
forgotten ``forget_s`` later, so a cluster whose nodes come and go does not list every node it
ever had. Time comes from an injectable clock so the rules are testable without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from polar.rollout.scheduler import NodeLoad
from polar.schemas.node import NodeStatus


@dataclass
class NodeRecord:
    node_id: str
    status: NodeStatus | None
    last_seen: float
    drain_requested: bool = False
    dead: bool = False
    drained: bool = False  # dead because it was drained and stopped, owing nothing
    dead_at: float | None = None
    load: NodeLoad | None = None
    credential: str | None = None  # what the server calls the node with

    @property
    def url(self) -> str | None:
        return self.status.url if self.status else None

    @property
    def draining(self) -> bool:
        return self.drain_requested or bool(self.status and self.status.draining)


class NodeRegistry:
    """Known nodes by id; ``expire`` turns silence into death exactly once per node."""

    def __init__(
        self,
        heartbeat_timeout_s: float,
        grace_s: float,
        clock: Callable[[], float] = time.monotonic,
        forget_s: float | None = None,
    ) -> None:
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.grace_s = grace_s
        self.forget_s = forget_s
        self.clock = clock
        self._nodes: dict[str, NodeRecord] = {}

    def register(self, status: NodeStatus) -> NodeRecord:
        """A node announced itself (first start, restart, or after the server forgot it)."""
        record = NodeRecord(node_id=status.node_id, status=status, last_seen=self.clock())
        previous = self._nodes.get(status.node_id)
        if previous is not None and not previous.dead:
            record.drain_requested = previous.drain_requested
            record.credential = previous.credential
        record.load = _load(status)
        self._nodes[status.node_id] = record
        return record

    def heartbeat(self, status: NodeStatus) -> NodeRecord | None:
        """Refresh a live node; ``None`` when unknown or already dead (it must register again)."""
        record = self._nodes.get(status.node_id)
        if record is None or record.dead or record.status is None:
            return None
        record.status = status
        record.last_seen = self.clock()
        record.load = _load(status)
        return record

    def expect(self, node_id: str) -> None:
        """Remember a node that owes results (after a server restart) so its grace period runs."""
        if node_id not in self._nodes:
            self._nodes[node_id] = NodeRecord(node_id=node_id, status=None, last_seen=self.clock())

    def drain(self, node_id: str) -> NodeRecord | None:
        record = self._nodes.get(node_id)
        if record is not None:
            record.drain_requested = True
        return record

    def healthy(self, record: NodeRecord) -> bool:
        return (
            not record.dead
            and record.status is not None
            and self.clock() - record.last_seen <= self.heartbeat_timeout_s
        )

    def loads(self) -> list[NodeLoad]:
        """Scheduler views of every node, with health and draining applied."""
        out = []
        for record in self._nodes.values():
            if record.load is None:
                continue
            record.load.healthy = self.healthy(record)
            record.load.draining = record.draining
            out.append(record.load)
        return out

    def expire(self) -> list[str]:
        """Node ids that just passed their grace period; each is reported once. Nodes dead
        (or drained) for longer than ``forget_s`` are dropped."""
        now = self.clock()
        newly_dead = []
        for record in list(self._nodes.values()):
            if not record.dead and now - record.last_seen > self.grace_s:
                record.dead, record.dead_at = True, now
                newly_dead.append(record.node_id)
            elif (
                record.dead_at is not None
                and self.forget_s is not None
                and now - record.dead_at > self.forget_s
            ):
                del self._nodes[record.node_id]
        return newly_dead

    def declare_dead(self, node_id: str, *, drained: bool = False) -> bool:
        """Mark a node dead now (its loss was observed, not inferred from silence; or, with
        ``drained``, it was drained and stopped); ``False`` if unknown or dead already. Like
        silence past the grace period, a heartbeat from it is then answered "register again"."""
        record = self._nodes.get(node_id)
        if record is None or record.dead:
            return False
        record.dead, record.drained, record.dead_at = True, drained, self.clock()
        return True

    def live(self, node_id: str) -> bool:
        """Registered in this server's life and not declared dead."""
        record = self._nodes.get(node_id)
        return record is not None and record.status is not None and not record.dead

    def get(self, node_id: str) -> NodeRecord | None:
        return self._nodes.get(node_id)

    def all(self) -> list[NodeRecord]:
        return list(self._nodes.values())


def _load(status: NodeStatus) -> NodeLoad:
    stages = status.stages
    return NodeLoad(
        node_id=status.node_id,
        run_workers=status.workers.run,
        postrun_workers=status.workers.postrun,
        init_workers=status.workers.init,
        capacity=status.capacity,
        before_run=stages.before_run_done,
        in_postrun=stages.postrun_queued + stages.postrun,
        in_init=stages.queued + stages.initializing,
    )
