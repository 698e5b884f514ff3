"""A gateway node's side of the rollout protocol: register, heartbeat, and deliver results.

Results are delivered with retry and exponential backoff until the rollout server acknowledges
them (it dedupes by session id, so a retry after a lost acknowledgement is harmless). Until then
the session stays in every heartbeat, so a server that restarted knows the node still owes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx

from polar.gateway.config import NodeConfig
from polar.schemas.node import (
    IDEMPOTENCY_HEADER,
    NodeReport,
    NodeStatus,
    Registered,
)
from polar.schemas.task import SessionResult, SessionStatus

log = logging.getLogger("polar.gateway.node")

_INITIAL_BACKOFF_S = 0.2


class NodeClient:
    """Talks to ``config.rollout_url``; ``status`` and ``sessions`` read the node's state."""

    def __init__(
        self,
        config: NodeConfig,
        status: Callable[[], NodeStatus],
        sessions: Callable[[], dict[str, SessionStatus]],
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if not config.rollout_url:
            raise ValueError("NodeClient needs node.rollout_url")
        self.config = config
        self.url = config.rollout_url.rstrip("/")
        self.status = status
        self.sessions = sessions
        self.client = client or httpx.AsyncClient()
        token = config.rollout_token
        self.headers = {"authorization": f"Bearer {token}"} if token else {}
        self.registered = asyncio.Event()
        self._undelivered: dict[str, SessionResult] = {}
        self._deliveries: dict[str, asyncio.Task[None]] = {}
        self._loop: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop = asyncio.create_task(self._heartbeat_loop(), name="node-heartbeat")

    async def stop(self, flush_s: float = 5.0) -> None:
        """Give pending deliveries ``flush_s`` to finish, then stop everything."""
        if self._deliveries:
            await asyncio.wait(list(self._deliveries.values()), timeout=flush_s)
        tasks = [*self._deliveries.values(), *([self._loop] if self._loop else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.client.aclose()

    def report(self) -> NodeReport:
        sessions = self.sessions()
        sessions.update({sid: r.status for sid, r in self._undelivered.items()})
        return NodeReport(status=self.status(), sessions=sessions)

    # -- results ---------------------------------------------------------------------------

    async def deliver(self, result: SessionResult) -> None:
        """Queue ``result`` for delivery (returns at once; delivery retries in the background)."""
        if result.session_id in self._deliveries:
            return
        self._undelivered[result.session_id] = result
        task = asyncio.create_task(self._deliver(result), name=f"deliver-{result.session_id}")
        self._deliveries[result.session_id] = task
        task.add_done_callback(lambda _: self._deliveries.pop(result.session_id, None))

    @property
    def undelivered(self) -> int:
        return len(self._undelivered)

    async def _deliver(self, result: SessionResult) -> None:
        body = result.model_dump_json()
        headers = {
            **self.headers,
            "content-type": "application/json",
            IDEMPOTENCY_HEADER: result.session_id,
        }
        attempt = 0
        while True:
            try:
                reply = await self.client.post(
                    f"{self.url}/results", content=body, headers=headers, timeout=30
                )
                if reply.is_success or reply.status_code in (404, 422):
                    if not reply.is_success:
                        log.error(
                            "rollout server refused the result of %s: HTTP %d %s",
                            result.session_id,
                            reply.status_code,
                            reply.text[:500],
                        )
                    self._undelivered.pop(result.session_id, None)
                    return
                log.info("result of %s: HTTP %d; retrying", result.session_id, reply.status_code)
            except httpx.HTTPError as exc:
                log.info("result of %s not delivered (%r); retrying", result.session_id, exc)
            await asyncio.sleep(self._backoff(attempt))
            attempt += 1

    def _backoff(self, attempt: int) -> float:
        return float(min(self.config.report_backoff_max_s, _INITIAL_BACKOFF_S * 2**attempt))

    # -- registration and heartbeats -------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_s
        attempt = 0
        registered = False
        while True:
            try:
                path = (
                    f"/nodes/{self.config.node_id}/heartbeat" if registered else "/nodes/register"
                )
                reply = await self.client.post(
                    self.url + path,
                    content=self.report().model_dump_json(),
                    headers={**self.headers, "content-type": "application/json"},
                    timeout=10,
                )
                if reply.status_code == 404 and registered:
                    registered = False
                    self.registered.clear()
                    continue
                reply.raise_for_status()
                answer = Registered.model_validate_json(reply.content)
                interval = min(self.config.heartbeat_s, answer.heartbeat_s)
                if not registered:
                    registered = True
                    self.registered.set()
                    log.info("registered with %s as %s", self.url, self.config.node_id)
                attempt = 0
                await asyncio.sleep(interval)
            except httpx.HTTPError as exc:
                log.warning("rollout server %s: %r; retrying", self.url, exc)
                await asyncio.sleep(min(interval, self._backoff(attempt)))
                attempt += 1
