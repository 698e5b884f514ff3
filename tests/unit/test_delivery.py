"""The one delivery loop: outcomes, backoff, deadline, giving up, transport errors."""

from __future__ import annotations

import httpx
import pytest

from polar.delivery import Outcome, RetryPolicy, deliver, deliver_sync, outcome_of

FAST = RetryPolicy(initial_s=0.001, max_s=0.004, deadline_s=5)


def scripted(*outcomes: Outcome | Exception):
    """An attempt that plays ``outcomes`` in order, counting its calls."""
    calls: list[int] = []

    def attempt() -> Outcome:
        item = outcomes[len(calls)]
        calls.append(1)
        if isinstance(item, Exception):
            raise item
        return item

    return attempt, calls


async def test_retries_until_delivered_and_counts_transport_errors_as_retry() -> None:
    attempt, calls = scripted(
        Outcome.RETRY, httpx.ConnectError("down"), Outcome.RETRY, Outcome.DELIVERED
    )

    async def run() -> Outcome:
        return attempt()

    assert await deliver(run, FAST) is Outcome.DELIVERED
    assert len(calls) == 4


@pytest.mark.parametrize("final", [Outcome.REFUSED, Outcome.REJECTED])
async def test_refused_and_rejected_end_at_once(final: Outcome) -> None:
    attempt, calls = scripted(Outcome.RETRY, final, Outcome.DELIVERED)

    async def run() -> Outcome:
        return attempt()

    assert await deliver(run, FAST) is final
    assert len(calls) == 2


async def test_gives_up_at_the_deadline() -> None:
    policy = RetryPolicy(initial_s=0.01, max_s=0.01, deadline_s=0.05)
    calls: list[int] = []

    async def never() -> Outcome:
        calls.append(1)
        return Outcome.RETRY

    assert await deliver(never, policy) is Outcome.GAVE_UP
    assert 2 <= len(calls) <= 10


async def test_gives_up_when_the_receiver_is_gone() -> None:
    calls: list[int] = []

    async def run() -> Outcome:
        calls.append(1)
        return Outcome.RETRY

    gone = iter([False, False, True])
    assert await deliver(run, FAST, give_up_if=lambda: next(gone)) is Outcome.GAVE_UP
    assert len(calls) == 2


def test_sync_variant_and_other_exceptions_propagate() -> None:
    attempt, calls = scripted(httpx.ReadTimeout("slow"), Outcome.DELIVERED)
    assert deliver_sync(attempt, FAST) is Outcome.DELIVERED and len(calls) == 2
    broken, _ = scripted(ValueError("a bug, not a network problem"))
    with pytest.raises(ValueError):
        deliver_sync(broken, FAST)


def test_backoff_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(initial_s=0.1, max_s=0.5)
    assert [policy.delay(n) for n in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, Outcome.DELIVERED),
        (201, Outcome.DELIVERED),
        (429, Outcome.REFUSED),
        (408, Outcome.RETRY),
        (503, Outcome.RETRY),
        (404, Outcome.REJECTED),
        (422, Outcome.REJECTED),
    ],
)
def test_reading_an_http_answer(status: int, expected: Outcome) -> None:
    reply = httpx.Response(status)
    assert outcome_of(reply, refused=frozenset({429})) is expected
