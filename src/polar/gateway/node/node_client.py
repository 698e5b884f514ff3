"""A gateway node's side of the rollout protocol: register, heartbeat, and deliver results.

Results are delivered with retry and exponential backoff until the rollout server acknowledges
them (it dedupes by session id, so a retry after a lost acknowledgement is harmless). Until then
the session stays in every heartbeat, so a server that restarted knows the node still owes it.

The node enrols with an enrolment secret (``rollout_token``, or the file ``rollout_token_file``)
and the server answers with this node's own credential, which every later call carries. The
credential is kept 0600 in the node's work_dir, so a restarted node registers its id again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import httpx
from pydantic import ValidationError

from polar.delivery import Outcome, RetryPolicy, deliver
from polar.gateway.config import NodeConfig
from polar.logs import log_event
from polar.schemas.node import (
    IDEMPOTENCY_HEADER,
    NodeReport,
    NodeStatus,
    Registered,
)
from polar.schemas.task import SessionResult, SessionStatus
from polar.tokens import NODE_CREDENTIAL_FILE, read_token, write_token

log = logging.getLogger("polar.gateway.node")

_INITIAL_BACKOFF_S = 0.2
_MIN_INTERVAL_S = 0.05  # whatever a server answers, never heartbeat in a busy loop
_REGISTER = "/nodes/register"


class NodeClient:
    """Talks to ``config.rollout_url``; ``status`` and ``sessions`` read the node's state."""

    def __init__(
        self,
        config: NodeConfig,
        status: Callable[[], NodeStatus],
        sessions: Callable[[], dict[str, SessionStatus]],
        client: httpx.AsyncClient | None = None,
        *,
        retire: Callable[[list[str]], Awaitable[None]] | None = None,
    ) -> None:
        if not config.rollout_url:
            raise ValueError("NodeClient needs node.rollout_url")
        self.config = config
        self.url = config.rollout_url.rstrip("/")
        self.status = status
        self.sessions = sessions
        self.client = client or httpx.AsyncClient()
        self.retire = retire
        self.credential_file = Path(config.work_dir) / NODE_CREDENTIAL_FILE
        self.credential = read_token(self.credential_file)
        self.registered = asyncio.Event()
        self._undelivered: dict[str, SessionResult] = {}
        self._deliveries: dict[str, asyncio.Task[None]] = {}
        self._loop: asyncio.Task[None] | None = None
        self._interval = config.heartbeat_s

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

    @property
    def headers(self) -> dict[str, str]:
        token = self.credential or self._enrolment_secret()
        return {"authorization": f"Bearer {token}"} if token else {}

    def _enrolment_secret(self) -> str | None:
        if self.config.rollout_token:
            return self.config.rollout_token
        if self.config.rollout_token_file is not None:
            return read_token(self.config.rollout_token_file)
        return None

    def _keep_credential(self, credential: str) -> None:
        if credential != self.credential:
            self.credential = credential
            write_token(self.credential_file, credential)

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
            "content-type": "application/json",
            IDEMPOTENCY_HEADER: result.session_id,
        }
        # No deadline: the server waits for this result for as long as the node lives.
        policy = RetryPolicy(
            initial_s=_INITIAL_BACKOFF_S,
            max_s=self.config.report_backoff_max_s,
            deadline_s=None,
            timeout_s=30,
        )
        attempt = partial(self._post_result, result, body, headers, policy.timeout_s)
        await deliver(attempt, policy, what=f"result of {result.session_id}")
        self._undelivered.pop(result.session_id, None)

    async def _post_result(
        self, result: SessionResult, body: str, headers: dict[str, str], timeout_s: float
    ) -> Outcome:
        session_id = result.session_id
        try:
            reply = await self.client.post(
                f"{self.url}/results",
                content=body,
                headers={**self.headers, **headers},
                timeout=timeout_s,
            )
        except httpx.HTTPError as exc:
            message = f"result of {session_id} not delivered ({exc!r}); retrying"
            self._log_result(result, "session.result_retry", message, error=repr(exc))
            return Outcome.RETRY
        if reply.is_success:
            message = f"result of {session_id} delivered to {self.url}"
            self._log_result(result, "session.result_delivered", message)
            return Outcome.DELIVERED
        status = reply.status_code
        if status in (403, 404, 422):  # not this node's, unknown, invalid: for good
            error = f"HTTP {status} {reply.text[:500]}"
            message = f"rollout server refused the result of {session_id}: {error}"
            self._log_result(
                result, "session.result_refused", message, logging.ERROR, error, status
            )
            return Outcome.REJECTED
        message = f"result of {session_id}: HTTP {status}; retrying"
        self._log_result(
            result, "session.result_retry", message, error=f"HTTP {status}", http_status=status
        )
        return Outcome.RETRY

    def _log_result(
        self,
        result: SessionResult,
        event: str,
        message: str,
        level: int = logging.INFO,
        error: str | None = None,
        http_status: int | None = None,
    ) -> None:
        log_event(
            log,
            event,
            message,
            level=level,
            session_id=result.session_id,
            task_id=result.task_id,
            node_id=self.config.node_id,
            http_status=http_status,
            error=error,
        )

    # -- registration and heartbeats -------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        """Register, then heartbeat every interval until the server has forgotten the node
        (it restarted, or declared the node dead); then register again."""
        heartbeat = f"/nodes/{self.config.node_id}/heartbeat"
        while True:
            await self._announce(_REGISTER)
            self.registered.set()
            log_event(
                log,
                "node.registered",
                f"registered with {self.url} as {self.config.node_id}",
                node_id=self.config.node_id,
                url=self.url,
            )
            while True:
                await asyncio.sleep(self._interval)
                if await self._announce(heartbeat) is Outcome.REFUSED:
                    break
            self.registered.clear()

    async def _announce(self, path: str) -> Outcome:
        """POST the node's report to ``path`` until the server answers: DELIVERED, or REFUSED
        when a heartbeat finds the node forgotten. Retries never wait longer than an interval."""
        policy = RetryPolicy(
            initial_s=_INITIAL_BACKOFF_S,
            max_s=min(self._interval, self.config.report_backoff_max_s),
            deadline_s=None,
            timeout_s=10,
        )
        attempt = partial(self._post_report, path, policy.timeout_s)
        return await deliver(attempt, policy, what=f"rollout server {self.url}")

    async def _post_report(self, path: str, timeout_s: float) -> Outcome:
        try:
            reply = await self.client.post(
                self.url + path,
                content=self.report().model_dump_json(),
                headers={**self.headers, "content-type": "application/json"},
                timeout=timeout_s,
            )
            if reply.status_code == 404 and path != _REGISTER:
                return Outcome.REFUSED
            if reply.status_code == 401 and path == _REGISTER and self.credential:
                # The server does not know this credential (its state was wiped): enrol anew.
                log.warning("rollout server %s refused this node's credential", self.url)
                self.credential = None
                return Outcome.RETRY
            if reply.status_code in (401, 403):
                log.error(
                    "rollout server %s refused node %s: HTTP %d %s (set node.rollout_token to "
                    "its enrolment secret)",
                    self.url,
                    self.config.node_id,
                    reply.status_code,
                    reply.text[:300],
                )
            reply.raise_for_status()
            answer = Registered.model_validate_json(reply.content)
        except (httpx.HTTPError, ValidationError) as exc:
            log.warning("rollout server %s: %r; retrying", self.url, exc)
            return Outcome.RETRY
        if answer.credential:
            self._keep_credential(answer.credential)
        if answer.retired and self.retire is not None:
            await self.retire(answer.retired)
        self._interval = min(self.config.heartbeat_s, max(answer.heartbeat_s, _MIN_INTERVAL_S))
        return Outcome.DELIVERED
