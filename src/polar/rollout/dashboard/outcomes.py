"""Each session of a task with, once final, its result's headline (reward, error, duration).

A final result never changes, so its headline is read out of the store once (SQLite parses the
stored JSON; Python never parses a trajectory for a page) and kept: a page that refreshes every
few seconds costs one cheap query per task, whatever the size of its trajectories.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from polar.rollout.store import Headline, RolloutStore
from polar.schemas.task import SessionStatus
from polar.schemas.token_delivery import TokenDelivery

# Headlines kept (about a hundred bytes each); the oldest go first.
KEPT = 200_000
_UNKNOWN = Headline(reward=None, error=None, seconds=None)  # not final yet


@dataclass(frozen=True)
class SessionOutcome:
    session_id: str
    sample_index: int
    status: SessionStatus
    node_id: str | None
    reward: float | None
    error: str | None
    seconds: float | None
    delivery: TokenDelivery | None = None


class Outcomes:
    """Thread-safe: pages read it from worker threads."""

    def __init__(self, store: RolloutStore, kept: int = KEPT) -> None:
        self.store = store
        self.kept = kept
        self._headlines: dict[str, Headline] = {}
        self._lock = threading.Lock()

    def of_task(self, task_id: str) -> list[SessionOutcome]:
        """The task's sessions in sample order. Blocking (SQLite)."""
        states = self.store.session_states(task_id)
        with self._lock:
            missing = [
                s.session_id
                for s in states
                if s.status.finished and s.session_id not in self._headlines
            ]
        if missing:
            found = self.store.headlines(missing)
            with self._lock:
                self._headlines.update(found)
                for sid in list(self._headlines)[: max(0, len(self._headlines) - self.kept)]:
                    del self._headlines[sid]
        with self._lock:
            known = [self._headlines.get(s.session_id, _UNKNOWN) for s in states]
        return [
            SessionOutcome(
                session_id=s.session_id,
                sample_index=s.sample_index,
                status=s.status,
                node_id=s.node_id,
                reward=h.reward,
                error=h.error,
                seconds=h.seconds,
                delivery=h.delivery,
            )
            for s, h in zip(states, known, strict=True)
        ]
