"""Retry until acknowledged: the one delivery loop behind every message that must arrive.

Dispatching a session to a node, a node's result to the rollout server, a result to a trainer's
callback, a client's task submission: each is an attempt that ends in an :class:`Outcome`, and
:func:`deliver` repeats the attempt with capped exponential backoff (tenacity) while it says
RETRY, until the policy's deadline, or until ``give_up_if`` says the receiver is gone for good.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from enum import StrEnum

import httpx
import tenacity
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("polar.delivery")

# Answers worth retrying besides 5xx: timeout, too early, overloaded.
RETRY_STATUS = frozenset({408, 425, 429})


class Outcome(StrEnum):
    """How one attempt (or a whole delivery) ended."""

    DELIVERED = "delivered"
    RETRY = "retry"
    REFUSED = "refused"  # not now, not here (full, draining): the caller re-routes it
    REJECTED = "rejected"  # never: a 4xx the receiver will not change its mind on
    GAVE_UP = "gave_up"  # the deadline passed, or the receiver is gone


class RetryPolicy(BaseModel):
    """Exponential backoff: ``initial_s``, doubling up to ``max_s``, for ``deadline_s`` in all."""

    model_config = ConfigDict(extra="forbid")

    initial_s: float = Field(0.5, gt=0)
    max_s: float = Field(30.0, gt=0)
    deadline_s: float | None = Field(
        3600.0, gt=0, description="Give up after this long; null retries for ever."
    )
    timeout_s: float = Field(10.0, gt=0, description="Per attempt.")

    def delay(self, attempt: int) -> float:
        """The wait before retry number ``attempt`` (0-based)."""
        return float(min(self.max_s, self.initial_s * (2**attempt)))


def outcome_of(reply: httpx.Response, *, refused: frozenset[int] = frozenset()) -> Outcome:
    """The usual reading of an HTTP answer: 2xx delivered, 5xx and ``RETRY_STATUS`` retry,
    ``refused`` statuses refused, any other 4xx rejected."""
    if reply.is_success:
        return Outcome.DELIVERED
    if reply.status_code in refused:
        return Outcome.REFUSED
    if reply.status_code >= 500 or reply.status_code in RETRY_STATUS:
        return Outcome.RETRY
    return Outcome.REJECTED


async def deliver(
    attempt: Callable[[], Awaitable[Outcome]],
    policy: RetryPolicy,
    *,
    what: str = "delivery",
    give_up_if: Callable[[], bool] | None = None,
) -> Outcome:
    """Run ``attempt`` until it returns something other than RETRY; a transport error counts
    as RETRY. Returns the last outcome, or GAVE_UP."""

    async def once() -> Outcome:
        if give_up_if is not None and give_up_if():
            return Outcome.GAVE_UP
        try:
            return await attempt()
        except httpx.TransportError as exc:
            log.info("%s: %r; retrying", what, exc)
            return Outcome.RETRY

    retrying = tenacity.AsyncRetrying(retry=_WHILE_RETRY, wait=_wait(policy), stop=_stop(policy))
    try:
        return await retrying(once)
    except tenacity.RetryError:
        log.warning("%s: gave up after %s", what, _spent(policy))
        return Outcome.GAVE_UP


def deliver_sync(
    attempt: Callable[[], Outcome], policy: RetryPolicy, *, what: str = "delivery"
) -> Outcome:
    """:func:`deliver` for synchronous callers (a trainer's loop)."""

    def once() -> Outcome:
        try:
            return attempt()
        except httpx.TransportError as exc:
            log.info("%s: %r; retrying", what, exc)
            return Outcome.RETRY

    try:
        retrying = tenacity.Retrying(retry=_WHILE_RETRY, wait=_wait(policy), stop=_stop(policy))
        return retrying(once)
    except tenacity.RetryError:
        log.warning("%s: gave up after %s", what, _spent(policy))
        return Outcome.GAVE_UP


_WHILE_RETRY = tenacity.retry_if_result(lambda outcome: outcome is Outcome.RETRY)


def _wait(policy: RetryPolicy) -> tenacity.wait.wait_base:
    return tenacity.wait_exponential(multiplier=policy.initial_s, max=policy.max_s)


def _stop(policy: RetryPolicy) -> tenacity.stop.stop_base:
    if policy.deadline_s is None:
        return tenacity.stop_never
    # Not a wait that would end past the deadline: the last attempt starts before it.
    return tenacity.stop_before_delay(policy.deadline_s)


def _spent(policy: RetryPolicy) -> str:
    return f"{policy.deadline_s:g}s" if policy.deadline_s is not None else "ever"
