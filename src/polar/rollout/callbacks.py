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

import httpx

from polar.delivery import Outcome, RetryPolicy, deliver, outcome_of
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
        except Exception:
            # A bug, not the network: say so, and record the failure rather than die silently.
            log.exception("%s broke", what)
            outcome = Outcome.GAVE_UP
        state = CallbackState.DELIVERED if outcome is Outcome.DELIVERED else CallbackState.FAILED
        await asyncio.to_thread(self.store.set_callback, result.session_id, state)
        if state == CallbackState.FAILED:
            log.warning("%s failed for good", what)
        if self.on_done is not None:
            self.on_done(result.session_id, state)

    async def _attempt(self, url: str, body: bytes, headers: dict[str, str]) -> Outcome:
        reply = await self.client.post(
            url, content=body, headers=headers, timeout=self.policy.timeout_s
        )
        outcome = outcome_of(reply)
        if outcome is Outcome.REJECTED:
            log.warning("callback to %s rejected with HTTP %d", url, reply.status_code)
        return outcome
