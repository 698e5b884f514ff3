"""What the server has seen finish lately: sessions, engine calls and sampled tokens over time.

The rollout server hears every finished session (its result, trajectory included) and nothing
of the engine calls in between, so the dashboard's throughput is counted when sessions finish:
engine calls and sampled tokens are each session's own (its trajectory's ``num_calls`` and
trainable tokens), attributed to the moment it finished. Kept in memory for ``WINDOW_S``: a
restarted server starts counting again.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from polar.schemas.task import SessionResult

WINDOW_S = 600.0


@dataclass(frozen=True)
class Finish:
    at: float
    node_id: str | None
    status: str
    calls: int
    tokens: int
    seconds: float | None


@dataclass(frozen=True)
class Rates:
    """Per-second and per-minute figures over the last ``span_s`` seconds."""

    span_s: float
    sessions_per_min: float
    calls_per_s: float
    tokens_per_s: float


@dataclass(frozen=True)
class NodeActivity:
    finished: int
    mean_seconds: float | None


class Activity:
    """A rolling window of finished sessions; used from the server's event loop only."""

    def __init__(self, clock: Callable[[], float] = time.time, window_s: float = WINDOW_S) -> None:
        self.clock = clock
        self.window_s = window_s
        self.started = clock()
        self.total = 0
        self._finishes: deque[Finish] = deque()

    def record(self, result: SessionResult) -> None:
        trajectory = result.trajectory
        traces = trajectory.traces if trajectory else []
        calls = trajectory.stats.num_calls if trajectory else 0
        self._finishes.append(
            Finish(
                at=self.clock(),
                node_id=result.node_id,
                status=result.status.value,
                calls=int(calls),
                tokens=sum(sum(trace.loss_mask) for trace in traces),
                seconds=result.timing.get("total"),
            )
        )
        self.total += 1
        self._prune()

    def rates(self, span_s: float = 60.0) -> Rates:
        """Rates over the last ``span_s`` (or since the server started, if that is shorter)."""
        now = self.clock()
        span = max(1.0, min(span_s, now - self.started))
        recent = [f for f in self._finishes if f.at > now - span]
        return Rates(
            span_s=span,
            sessions_per_min=60 * len(recent) / span,
            calls_per_s=sum(f.calls for f in recent) / span,
            tokens_per_s=sum(f.tokens for f in recent) / span,
        )

    def histogram(self, buckets: int = 40) -> list[int]:
        """Sessions finished per bucket over the window, oldest first."""
        now = self.clock()
        width = self.window_s / buckets
        counts = [0] * buckets
        for f in self._finishes:
            index = int((now - f.at) / width)
            if 0 <= index < buckets:
                counts[buckets - 1 - index] += 1
        return counts

    def by_node(self) -> dict[str, NodeActivity]:
        """Per node, over the window: sessions finished and their mean duration."""
        found: dict[str, list[Finish]] = {}
        for f in self._finishes:
            if f.node_id is not None:
                found.setdefault(f.node_id, []).append(f)
        out = {}
        for node_id, finishes in found.items():
            seconds = [f.seconds for f in finishes if f.seconds is not None]
            out[node_id] = NodeActivity(
                finished=len(finishes),
                mean_seconds=sum(seconds) / len(seconds) if seconds else None,
            )
        return out

    def _prune(self) -> None:
        horizon = self.clock() - self.window_s
        while self._finishes and self._finishes[0].at < horizon:
            self._finishes.popleft()
