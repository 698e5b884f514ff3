"""Which node gets the next session: pure logic, no I/O, so it is easy to test and cheap to run.

A session goes to a healthy, non-draining node with free capacity. Among those, the least
pressure wins, compared stage by stage: first the run slots (every session not yet past RUNNING
will need one, so queued and initializing sessions count too), then post-run, then init.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class NodeLoad:
    """The scheduler's picture of one node, updated optimistically as it assigns sessions."""

    node_id: str
    run_workers: int
    postrun_workers: int
    init_workers: int
    capacity: int
    before_run: int = 0
    in_postrun: int = 0
    in_init: int = 0
    healthy: bool = True
    draining: bool = False

    @property
    def eligible(self) -> bool:
        return self.healthy and not self.draining and self.capacity > 0

    def pressure(self) -> tuple[float, float, float, str]:
        """Sort key: run, then post-run, then init pressure; the node id breaks ties stably."""
        return (
            self.before_run / self.run_workers,
            self.in_postrun / self.postrun_workers,
            self.in_init / self.init_workers,
            self.node_id,
        )

    def assign(self) -> None:
        """Count one more session against this node until its next status report."""
        self.capacity -= 1
        self.before_run += 1
        self.in_init += 1


def choose_node(loads: Iterable[NodeLoad]) -> NodeLoad | None:
    """The eligible node with the least pressure, or ``None`` when no node can take a session."""
    best: NodeLoad | None = None
    best_key: tuple[float, float, float, str] | None = None
    for load in loads:
        if not load.eligible:
            continue
        key = load.pressure()
        if best_key is None or key < best_key:
            best, best_key = load, key
    return best


def plan(loads: list[NodeLoad], sessions: int) -> list[str]:
    """Node ids for up to ``sessions`` sessions, assigning one at a time (stops when full)."""
    chosen: list[str] = []
    for _ in range(sessions):
        node = choose_node(loads)
        if node is None:
            break
        node.assign()
        chosen.append(node.node_id)
    return chosen
