"""Delivering SessionResults to the trainer's ``callback_url``, with retry and backoff.

Each result is POSTed with an ``Idempotency-Key`` (the session id) so a receiver can drop the
rare duplicate that a lost acknowledgement causes. On our side a session is delivered at most
once after it was acknowledged: delivery state is in the store, and a session already being
delivered is never queued a second time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httpx

from polar.delivery import Outcome, RetryPolicy, deliver, outcome_of
from polar.logs import log_event
from polar.rollout.store import RolloutStore
from polar.schemas.node import IDEMPOTENCY_HEADER, SESSION_HEADER
from polar.schemas.rollout import CallbackState
from polar.schemas.task import SessionResult

log = logging.getLogger("polar.rollout.callbacks")


class CallbackSender:
    """Runs one delivery task per pending session; ``send`` is idempotent per session id."""

    def __init__(
        self,
        store: RolloutStore,
        policy: RetryPolicy,
        client: httpx.AsyncClient,
        on_done: Callable[[str, CallbackState], None] | None = None,
        on_retry: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.client = client
        self.on_done = on_done
        self.on_retry = on_retry
        self._active: dict[str, asyncio.Task[None]] = {}

    @property
    def pending(self) -> int:
        return len(self._active)

    def send(self, url: str, result: SessionResult) -> None:
        """Start delivering ``result`` unless a delivery of this session is already under way."""
        if result.session_id in self._active:
            return
        task = asyncio.create_task(self._deliver(url, result), name=f"callback-{result.session_id}")
        self._active[result.session_id] = task
        task.add_done_callback(lambda _: self._active.pop(result.session_id, None))

    async def aclose(self) -> None:
        tasks = list(self._active.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _deliver(self, url: str, result: SessionResult) -> None:
        body = result.model_dump_json().encode()
        headers = {
            "content-type": "application/json",
            IDEMPOTENCY_HEADER: result.session_id,
            SESSION_HEADER: result.session_id,
        }
        what = f"callback for session {result.session_id} to {url}"
        attempts = 0

        async def attempt() -> Outcome:
            nonlocal attempts
            attempts += 1
            if attempts > 1 and self.on_retry is not None:
                self.on_retry()
            return await self._attempt(url, body, headers)

        try:
            outcome = await deliver(attempt, self.policy, what=what)
        except Exception as exc:
            # A bug, not the network: say so, and record the failure rather than die silently.
            _log(
                result,
                "session.callback_broke",
                f"{what} broke",
                level=logging.ERROR,
                exc_info=True,
                url=url,
                error=repr(exc),
            )
            outcome = Outcome.GAVE_UP
        state = CallbackState.DELIVERED if outcome is Outcome.DELIVERED else CallbackState.FAILED
        await asyncio.to_thread(self.store.set_callback, result.session_id, state)
        failed = state == CallbackState.FAILED
        _log(
            result,
            "session.callback",
            f"{what} failed for good" if failed else f"{what} delivered",
            level=logging.WARNING if failed else logging.INFO,
            url=url,
            state=state.value,
            error=f"callback not delivered ({outcome.value})" if failed else None,
        )
        if self.on_done is not None:
            self.on_done(result.session_id, state)

    async def _attempt(self, url: str, body: bytes, headers: dict[str, str]) -> Outcome:
        reply = await self.client.post(
            url, content=body, headers=headers, timeout=self.policy.timeout_s
        )
        outcome = outcome_of(reply)
        if outcome is Outcome.REJECTED:
            log_event(
                log,
                "session.callback_rejected",
                f"callback to {url} rejected with HTTP {reply.status_code}",
                level=logging.WARNING,
                session_id=headers[SESSION_HEADER],
                url=url,
                http_status=reply.status_code,
                error=f"HTTP {reply.status_code}",
            )
        return outcome


def _log(result: SessionResult, event: str, message: str, **fields: Any) -> None:
    log_event(
        log,
        event,
        message,
        session_id=result.session_id,
        task_id=result.task_id,
        node_id=result.node_id,
        **fields,
    )
