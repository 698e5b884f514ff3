"""Every lifecycle stage is bounded, POST-RUN included: a post-run past the evaluator's
``timeout_seconds`` ends its session as an evaluator or infra failure with the reason, and a
stage or teardown that will not end (a host read stuck in a thread cannot be cancelled) is left
behind after a grace, so its worker serves the next session. Before, one stuck post-run held
its worker for good; two stopped every later session on the node."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from polar.gateway.config import NodeConfig
from polar.gateway.node import lifecycle
from polar.gateway.node.lifecycle import Lifecycle, NodeSession, RunOutcome
from polar.schemas.node import SessionDispatch
from polar.schemas.task import (
    EvaluatorSpec,
    SessionFailure,
    SessionResult,
    SessionStatus,
    TaskRequest,
)

STUCK = threading.Event()  # set at teardown: releases every thread a test left blocked


class Work:
    """``mode`` says how post-run goes: ok, slow while building or evaluating (cancellable),
    stuck in a thread while evaluating (not cancellable); ``+hung``: its teardown hangs too."""

    def __init__(self, session: NodeSession, mode: str) -> None:
        self.session, self.mode = session, mode

    async def init(self) -> None:
        return None

    async def run(self, budget_s: float) -> None:
        return None

    async def postrun(self, outcome: RunOutcome) -> SessionResult:
        if self.mode.startswith(("slow_evaluating", "stuck")):
            self.session.set_status(SessionStatus.EVALUATING)
        else:
            self.session.set_status(SessionStatus.BUILDING)
        if self.mode.startswith("slow"):
            await asyncio.sleep(60)
        elif self.mode.startswith("stuck"):
            while True:  # a blocked read: cancelling the await does not end the thread
                try:
                    await asyncio.shield(asyncio.to_thread(STUCK.wait))
                    break
                except asyncio.CancelledError:
                    continue
        return SessionResult(
            session_id=self.session.session_id,
            task_id=self.session.task_id,
            status=SessionStatus.COMPLETED,
            reward=1.0,
        )

    async def abort(self) -> None:
        if self.mode.endswith("+hung"):
            await asyncio.shield(asyncio.to_thread(STUCK.wait))


@pytest.fixture
async def node(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(lifecycle, "RELEASE_GRACE_S", 0.2)
    modes: dict[str, str] = {}
    life = Lifecycle(
        NodeConfig(postrun_workers=1, run_workers=2, init_workers=2),
        lambda session: Work(session, modes[session.session_id]),
    )
    life.start()
    STUCK.clear()
    yield life, modes
    STUCK.set()
    await life.stop(grace_s=2)


async def submit(life: Lifecycle, modes: dict[str, str], sid: str, mode: str) -> str:
    sid = sid.ljust(16, "0")
    modes[sid] = mode
    task = TaskRequest(task_id="t", instruction="x", evaluator=EvaluatorSpec(timeout_seconds=0.3))
    await life.dispatch(SessionDispatch(session_id=sid, task=task))
    return sid


async def result(life: Lifecycle, sid: str) -> SessionResult:
    return await asyncio.wait_for(life.wait(sid), 10)


@pytest.mark.parametrize(
    ("mode", "failure"),
    [
        ("slow_building", SessionFailure(kind="infra", reason="postrun_timeout")),
        ("slow_evaluating", SessionFailure(kind="evaluator", reason="evaluator_timeout")),
        ("stuck", SessionFailure(kind="evaluator", reason="evaluator_timeout")),
    ],
)
async def test_a_post_run_past_its_bound_ends_its_session_and_frees_the_worker(
    node: Any, mode: str, failure: SessionFailure
) -> None:
    life, modes = node
    # One post-run worker: each of two wedged sessions would have held it for good.
    first = await submit(life, modes, "wedge1", mode)
    second = await submit(life, modes, "wedge2", mode)
    honest = await submit(life, modes, "honest", "ok")
    for sid in (first, second):
        wedged = await result(life, sid)
        assert wedged.status == SessionStatus.ERROR
        assert wedged.failure == failure
        assert "timeout_seconds of 0.3s" in (wedged.error or "")
    assert (await result(life, honest)).status == SessionStatus.COMPLETED


async def test_a_teardown_that_hangs_does_not_hold_the_worker(node: Any) -> None:
    life, modes = node
    queued = await submit(life, modes, "queued", "ok+hung")
    life.cancel(queued)  # cancelled while queued: torn down outside the pools
    assert (await result(life, queued)).failure == SessionFailure(kind="infra", reason="cancelled")
    for name in ("hung1", "hung2"):  # post-run past its bound, then a teardown that hangs
        hung = await submit(life, modes, name, "slow_building+hung")
        assert (await result(life, hung)).failure == SessionFailure(
            kind="infra", reason="postrun_timeout"
        )
    honest = await submit(life, modes, "honest", "ok")
    assert (await result(life, honest)).status == SessionStatus.COMPLETED
