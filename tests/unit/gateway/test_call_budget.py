"""agent.max_model_calls: counting at the gateway, and ending the run once it is spent."""

from __future__ import annotations

import asyncio

import pytest

from polar.errors import CallBudgetSpent, HarnessError
from polar.gateway.node.call_budget import CALLS_SPENT, ModelCallsSpent, until_calls_spent
from polar.gateway.sessions import GatewaySession, SessionTags


def test_calls_up_to_the_cap_pass_and_the_next_is_a_400_that_marks_the_budget_spent() -> None:
    session = GatewaySession("ps-a", tags=SessionTags(max_model_calls=2))
    session.admit_call()
    session.admit_call()
    assert not session.budget_spent.is_set()
    with pytest.raises(CallBudgetSpent) as refused:
        session.admit_call()
    assert refused.value.status == 400 and refused.value.kind == "call_budget_spent"
    assert "2 model calls" in str(refused.value)
    assert session.budget_spent.is_set() and session.admitted == 2


def test_no_cap_means_no_limit() -> None:
    session = GatewaySession("ps-b")
    for _ in range(100):
        session.admit_call()
    assert session.admitted == 100 and not session.budget_spent.is_set()


async def test_a_harness_that_ignores_the_refusal_is_cancelled() -> None:
    session = GatewaySession("ps-c", tags=SessionTags(max_model_calls=1))
    cancelled = asyncio.Event()

    async def stubborn() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    loop = asyncio.get_running_loop()
    loop.call_later(0.05, session.budget_spent.set)
    with pytest.raises(ModelCallsSpent) as spent:
        await asyncio.wait_for(until_calls_spent(stubborn(), session), 5)
    assert cancelled.is_set()
    assert spent.value.failure == CALLS_SPENT
    assert "budget of 1 model calls ran out" in str(spent.value)


async def test_a_harness_that_exits_on_the_refusal_ends_as_calls_spent_not_as_a_crash() -> None:
    session = GatewaySession("ps-d", tags=SessionTags(max_model_calls=1))

    async def exits_on_error() -> str:
        session.budget_spent.set()
        raise HarnessError("pi exited with status 1")

    with pytest.raises(ModelCallsSpent):
        await until_calls_spent(exits_on_error(), session)


async def test_a_crash_before_the_cap_stays_a_crash_and_a_clean_run_returns() -> None:
    session = GatewaySession("ps-e", tags=SessionTags(max_model_calls=3))

    async def crashes() -> str:
        raise HarnessError("exited with status 7")

    async def fine() -> str:
        return "ok"

    with pytest.raises(HarnessError) as crash:
        await until_calls_spent(crashes(), session)
    assert not isinstance(crash.value, ModelCallsSpent)
    assert await until_calls_spent(fine(), session) == "ok"
    assert await until_calls_spent(fine(), None) == "ok"


async def test_cancelling_the_stage_cancels_the_harness_run_too() -> None:
    session = GatewaySession("ps-f", tags=SessionTags(max_model_calls=4))
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def harness() -> str:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    stage = asyncio.create_task(until_calls_spent(harness(), session))
    await started.wait()
    stage.cancel()  # what the lifecycle does when the session's time budget runs out
    with pytest.raises(asyncio.CancelledError):
        await stage
    assert cancelled.is_set()
