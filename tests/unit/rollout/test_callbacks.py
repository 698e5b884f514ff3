"""Callback delivery: retry with backoff until acknowledged, then never again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from polar.delivery import RetryPolicy
from polar.rollout.callbacks import CallbackSender
from polar.rollout.store import RolloutStore
from polar.schemas.rollout import CallbackState
from polar.schemas.task import SessionResult, SessionStatus, TaskRequest

FAST = RetryPolicy(initial_s=0.01, max_s=0.02, deadline_s=2, timeout_s=1)


class Receiver:
    """A trainer endpoint that is down for the first ``down`` attempts."""

    def __init__(self, down: int = 0, status: int = 200) -> None:
        self.down = down
        self.status = status
        self.attempts: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.attempts.append(request)
        if len(self.attempts) <= self.down:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(self.status)


@pytest.fixture
def store(tmp_path: Path):
    s = RolloutStore(tmp_path)
    s.create_task(
        TaskRequest(task_id="t", instruction="x", num_samples=2, callback_url="http://cb/x"),
        ["s1", "s2"],
    )
    yield s
    s.close()


def finish(store: RolloutStore, sid: str) -> SessionResult:
    result = SessionResult(session_id=sid, task_id="t", status=SessionStatus.COMPLETED, reward=1)
    store.finish(result)
    return result


async def drain(sender: CallbackSender) -> None:
    for _ in range(400):
        if sender.pending == 0:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("deliveries did not finish")


async def test_receiver_down_then_up_gets_it_once(store: RolloutStore) -> None:
    receiver = Receiver(down=3)
    done: list[tuple[str, str]] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(receiver)) as client:
        sender = CallbackSender(store, FAST, client, on_done=lambda s, st: done.append((s, st)))
        result = finish(store, "s1")
        sender.send("http://cb/x", result)
        sender.send("http://cb/x", result)  # a duplicate while in flight: ignored
        await drain(sender)
    assert len(receiver.attempts) == 4
    last = receiver.attempts[-1]
    assert last.headers["idempotency-key"] == "s1"
    assert last.headers["x-polar-session-id"] == "s1"
    assert SessionResult.model_validate_json(last.content) == result
    assert done == [("s1", CallbackState.DELIVERED)]
    assert store.session("s1").callback == CallbackState.DELIVERED  # type: ignore[union-attr]
    assert store.pending_callbacks() == []


async def test_server_errors_are_retried_client_errors_are_not(store: RolloutStore) -> None:
    flaky = Receiver(down=0, status=503)
    async with httpx.AsyncClient(transport=httpx.MockTransport(flaky)) as client:
        policy = RetryPolicy(initial_s=0.01, max_s=0.01, deadline_s=0.1, timeout_s=1)
        sender = CallbackSender(store, policy, client)
        sender.send("http://cb/x", finish(store, "s1"))
        await drain(sender)
    assert len(flaky.attempts) > 3
    assert store.session("s1").callback == CallbackState.FAILED  # type: ignore[union-attr]

    refusing = Receiver(status=400)
    async with httpx.AsyncClient(transport=httpx.MockTransport(refusing)) as client:
        sender = CallbackSender(store, FAST, client)
        sender.send("http://cb/x", finish(store, "s2"))
        await drain(sender)
    assert len(refusing.attempts) == 1
    assert store.session("s2").callback == CallbackState.FAILED  # type: ignore[union-attr]


class Script:
    """A trainer endpoint that answers ``replies`` in order (an exception is raised)."""

    def __init__(self, *replies: int | Exception) -> None:
        self.replies = list(replies)
        self.attempts = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        reply = self.replies[min(self.attempts, len(self.replies) - 1)]
        self.attempts += 1
        if isinstance(reply, Exception):
            raise reply
        return httpx.Response(reply)


@pytest.mark.parametrize(
    ("replies", "attempts", "state"),
    [
        ((500, 500, 200), 3, CallbackState.DELIVERED),
        ((429, 408, 425, 502, 201), 5, CallbackState.DELIVERED),
        ((400, 200), 1, CallbackState.FAILED),
        ((503, 404, 200), 2, CallbackState.FAILED),
    ],
)
async def test_each_answer_has_its_outcome(
    store: RolloutStore, replies: tuple[int, ...], attempts: int, state: CallbackState
) -> None:
    receiver = Script(*replies)
    done: list[tuple[str, str]] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(receiver)) as client:
        sender = CallbackSender(store, FAST, client, on_done=lambda s, st: done.append((s, st)))
        sender.send("http://cb/x", finish(store, "s1"))
        await drain(sender)
    assert receiver.attempts == attempts
    assert done == [("s1", state)]
    assert store.session("s1").callback == state  # type: ignore[union-attr]


async def test_a_bug_in_an_attempt_fails_the_callback_loudly(
    store: RolloutStore, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = Script(ValueError("not a network problem"), 200)
    done: list[tuple[str, str]] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(receiver)) as client:
        sender = CallbackSender(store, FAST, client, on_done=lambda s, st: done.append((s, st)))
        sender.send("http://cb/x", finish(store, "s1"))
        await drain(sender)
    assert receiver.attempts == 1
    assert done == [("s1", CallbackState.FAILED)]
    assert store.session("s1").callback == CallbackState.FAILED  # type: ignore[union-attr]
    assert any(r.exc_info and "not a network problem" in str(r.exc_info[1]) for r in caplog.records)
