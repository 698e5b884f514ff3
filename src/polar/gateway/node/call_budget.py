"""The run side of ``agent.max_model_calls``: end the harness once the gateway refused a call.

The gateway counts a session's model calls (:meth:`GatewaySession.admit_call`) and answers the
one past the cap with a 400 in the harness's provider format. Some harnesses exit on that, some
retry or go on; either way the run ends here, as a TIMEOUT with the calls made so far kept as
the partial trace and evaluated like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from polar.errors import HarnessError, ModelCallsSpent
from polar.gateway.sessions import GatewaySession
from polar.schemas.task import SessionFailure

T = TypeVar("T")

CALLS_SPENT = SessionFailure(kind="timeout", reason="model_calls_spent")


async def until_calls_spent(work: Awaitable[T], session: GatewaySession | None) -> T:
    """Await ``work`` (the harness run), unless the session's call budget runs out first:
    then cancel it (which kills the harness) and raise :class:`ModelCallsSpent`."""
    cap = session.max_model_calls if session is not None else None
    if session is None or cap is None:
        return await work
    run = asyncio.ensure_future(work)
    spent = asyncio.ensure_future(session.budget_spent.wait())
    try:
        await asyncio.wait({run, spent}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the stage was cancelled (its time budget, a cancel): so is the run
        await _stop(run)
        raise
    finally:
        spent.cancel()
    message = f"the session's budget of {cap} model calls ran out"
    if not run.done():
        await _stop(run)
        raise ModelCallsSpent(message, failure=CALLS_SPENT)
    try:
        return run.result()
    except HarnessError as exc:  # it exited on the refusal before the event was seen
        if session.budget_spent.is_set():
            raise ModelCallsSpent(message, failure=CALLS_SPENT) from exc
        raise


async def _stop(run: asyncio.Future[T]) -> None:
    """Cancel the harness run (the runtime kills its process tree) and wait until it is gone."""
    run.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await run
