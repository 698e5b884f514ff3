"""What the rollout service's parts share: its state, and the calls one part makes into
another (task lifecycle in ``service.py``, dispatch in ``dispatch.py``, node liveness in
``liveness.py``); :class:`~polar.rollout.service.RolloutService` joins them."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod

import httpx

from polar.rollout.access import Access
from polar.rollout.activity import Activity
from polar.rollout.callbacks import CallbackSender
from polar.rollout.config import RolloutServerConfig
from polar.rollout.events import EventBus
from polar.rollout.metrics import RolloutMetrics
from polar.rollout.node_provider import NodeProvider
from polar.rollout.nodes import NodeRecord, NodeRegistry
from polar.rollout.store import RolloutStore, SessionRow
from polar.schemas.task import (
    SessionFailure,
    SessionResult,
    SessionStatus,
    TaskRequest,
)


class ServiceCore(ABC):
    """The rollout service's state; each part reads and writes it, none owns it alone."""

    config: RolloutServerConfig
    provider: NodeProvider
    store: RolloutStore
    access: Access
    nodes: NodeRegistry
    events: EventBus
    metrics: RolloutMetrics
    activity: Activity
    client: httpx.AsyncClient
    callbacks: CallbackSender
    _requests: dict[str, TaskRequest]
    _sending: dict[str, asyncio.Task[None]]
    _dispatch_slots: asyncio.Semaphore  # bounds dispatch POSTs in flight (dispatch.py)
    _known_status: dict[str, SessionStatus]
    _loops: list[asyncio.Task[None]]
    _deadlines: dict[str, asyncio.Task[None]]
    _wake: asyncio.Event | None

    @abstractmethod
    async def accept_result(self, result: SessionResult) -> bool:
        """Record a final result (the task lifecycle)."""

    @abstractmethod
    def _request(self, task_id: str) -> TaskRequest:
        """The task's request (the task lifecycle)."""

    @abstractmethod
    def wake(self) -> None:
        """Run the dispatch loop now (dispatch)."""

    @abstractmethod
    def _node_headers(self, node_id: str) -> dict[str, str]:
        """The credential to call a node with (dispatch)."""

    @abstractmethod
    def node_state(self, record: NodeRecord) -> str:
        """A node's state as the metrics name it (liveness)."""


def failed_result(row: SessionRow, node_id: str | None, error: str, reason: str) -> SessionResult:
    """A session this server ends itself: the infrastructure failed it, not the policy."""
    return SessionResult(
        session_id=row.session_id,
        task_id=row.task_id,
        status=SessionStatus.ERROR,
        node_id=node_id,
        error=error,
        failure=SessionFailure(kind="infra", reason=reason),
        sample_index=row.sample_index,
    )
