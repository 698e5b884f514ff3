"""The node's pools with scripted stage bodies: order, READY bound, budget, cancel, idempotence."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from polar.gateway.config import NodeConfig
from polar.gateway.node.lifecycle import (
    CANCELLED,
    AlreadyRan,
    Lifecycle,
    NodeDraining,
    NodeFull,
    NodeSession,
    RunOutcome,
)
from polar.gateway.sessions import GatewaySession
from polar.schemas.node import SessionDispatch
from polar.schemas.task import SessionFailure, SessionResult, SessionStatus, TaskRequest


@dataclass
class Plan:
    """How the fake stages behave for one session."""

    init_s: float = 0.0
    model_s: float = 0.0  # RUN starts with one model call this long
    run_s: float = 0.0
    post_s: float = 0.0
    init_error: Exception | None = None
    run_error: Exception | None = None
    post_error: Exception | None = None


@dataclass
class Journal:
    events: list[tuple[str, str]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)


class FakeWork:
    def __init__(self, session: NodeSession, plan: Plan, journal: Journal, life: Lifecycle):
        self.session, self.plan, self.journal, self.life = session, plan, journal, life
        self.calls = GatewaySession(session.session_id)

    def model_seconds(self) -> float:
        return self.calls.model_seconds()

    async def init(self) -> None:
        self.journal.events.append(("init", self.session.session_id))
        await asyncio.sleep(self.plan.init_s)
        if self.plan.init_error:
            raise self.plan.init_error

    async def run(self, budget_s: float) -> None:
        self.journal.events.append(("run", self.session.session_id))
        self.calls.call_opened()
        await asyncio.sleep(self.plan.model_s)
        self.calls.call_closed()
        await asyncio.sleep(self.plan.run_s)
        if self.plan.run_error:
            raise self.plan.run_error

    async def postrun(self, outcome: RunOutcome) -> SessionResult:
        self.journal.events.append(("postrun", self.session.session_id))
        self.session.set_status(SessionStatus.BUILDING)
        await asyncio.sleep(self.plan.post_s)
        if self.plan.post_error:
            raise self.plan.post_error
        return SessionResult(
            session_id=self.session.session_id,
            task_id=self.session.task_id,
            status=outcome.status,
            error=outcome.error,
            reward=1.0,
            metadata={"reached_run": outcome.reached_run},
        )

    async def abort(self) -> None:
        self.journal.aborted.append(self.session.session_id)


def dispatch(sid: str, timeout: float = 5.0, counts_model_time: bool = True) -> SessionDispatch:
    task = TaskRequest(
        task_id="t",
        instruction="x",
        timeout_seconds=timeout,
        timeout_counts_model_time=counts_model_time,
    )
    return SessionDispatch(session_id=sid.ljust(16, "0"), task=task)


class Node:
    def __init__(self, plans: dict[str, Plan] | None = None, **config: object) -> None:
        self.plans = plans or {}
        self.journal = Journal()
        self.results: list[SessionResult] = []
        self.life = Lifecycle(
            NodeConfig(**config),  # type: ignore[arg-type]
            self._work,
            on_finished=self._finished,
            known_ids={"old".ljust(16, "0")},
        )

    def _work(self, session: NodeSession) -> FakeWork:
        plan = self.plans.get(session.session_id.rstrip("0"), Plan())
        return FakeWork(session, plan, self.journal, self.life)

    async def _finished(self, result: SessionResult) -> None:
        self.results.append(result)

    async def submit(
        self, sid: str, timeout: float = 5.0, counts_model_time: bool = True
    ) -> NodeSession:
        return (await self.life.dispatch(dispatch(sid, timeout, counts_model_time)))[0]

    async def result(self, sid: str) -> SessionResult:
        return await asyncio.wait_for(self.life.wait(sid.ljust(16, "0")), 5)


@pytest.fixture
async def node_factory():
    nodes: list[Node] = []

    def make(plans: dict[str, Plan] | None = None, **config: object) -> Node:
        node = Node(plans, **config)
        node.life.start()
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        await node.life.stop(grace_s=2)


async def test_a_session_goes_through_every_stage_with_timings(node_factory) -> None:
    node = node_factory({"a": Plan(init_s=0.02, run_s=0.03, post_s=0.01)})
    await node.submit("a")
    result = await node.result("a")
    assert result.status == SessionStatus.COMPLETED and result.reward == 1.0
    assert result.failure is None
    assert [e for e, _ in node.journal.events] == ["init", "run", "postrun"]
    assert result.timing["init"] >= 0.02 and result.timing["run"] >= 0.03
    assert result.timing["postrun"] >= 0.01
    assert result.timing["total"] >= 0.06
    assert set(result.timing) >= {"queued", "init", "ready_wait", "run", "postrun_wait"}
    assert node.results == [result]
    assert node.life.counts().unfinished == 0 and node.life.finished_count == 1


async def test_dispatch_is_idempotent_and_admission_is_enforced(node_factory) -> None:
    node = node_factory({"a": Plan(run_s=0.2)}, queue_limit=2)
    first, created = await node.life.dispatch(dispatch("a"))
    again, created_again = await node.life.dispatch(dispatch("a"))
    assert created and not created_again and again is first
    with pytest.raises(AlreadyRan):
        await node.life.dispatch(dispatch("old"))
    await node.submit("b")
    with pytest.raises(NodeFull):
        await node.submit("c")
    node.life.drain()
    with pytest.raises(NodeDraining):
        await node.submit("d")
    await node.result("a")
    assert [e for e, s in node.journal.events if s.startswith("a")].count("run") == 1
    assert (await node.life.dispatch(dispatch("a")))[0].finished  # still answers after finishing


async def test_ready_buffer_bounds_prepared_runtimes_and_feeds_run_slots(node_factory) -> None:
    plans = {f"s{i}": Plan(init_s=0.005, run_s=0.05) for i in range(12)}
    node = node_factory(plans, init_workers=4, run_workers=2, ready_buffer=3)
    samples = []

    async def sample() -> None:
        while True:
            samples.append(node.life.counts())
            await asyncio.sleep(0.002)

    sampler = asyncio.create_task(sample())
    for i in range(12):
        await node.submit(f"s{i}")
    results = [await node.result(f"s{i}") for i in range(12)]
    sampler.cancel()
    assert all(r.status == SessionStatus.COMPLETED for r in results)
    assert max(c.running for c in samples) == 2
    assert max(c.initializing + c.ready for c in samples) == 3  # prepared ahead, never more
    assert max(c.ready for c in samples) >= 2  # a prepared runtime waits for each slot


async def test_inline_mode_runs_init_on_the_run_slot(node_factory) -> None:
    node = node_factory({}, run_workers=1, ready_buffer=0)
    await node.submit("a")
    await node.submit("b")
    await node.result("b")
    kinds = [e for e, _ in node.journal.events if e != "postrun"]
    assert kinds == ["init", "run", "init", "run"]


async def test_budget_runs_out_in_run_timeout_result_still_post_runs(node_factory) -> None:
    node = node_factory({"slow": Plan(init_s=0.05, run_s=5)})
    await node.submit("slow", timeout=0.2)
    result = await node.result("slow")
    assert result.status == SessionStatus.TIMEOUT
    assert "ran out during run" in (result.error or "")
    assert result.failure == SessionFailure(kind="timeout", reason="budget_exhausted")
    assert result.metadata["reached_run"] is True
    assert ("postrun", "slow".ljust(16, "0")) in node.journal.events
    assert 0.15 < result.timing["total"] < 1.0  # budget counted from INIT


async def test_waiting_in_ready_does_not_spend_the_budget(node_factory) -> None:
    # One run slot, a deep READY buffer: "b" is prepared at once and then waits 0.4 s behind
    # "a", longer than its whole 0.3 s budget, yet its own 0.1 s of work fits.
    plans = {"a": Plan(run_s=0.4), "b": Plan(init_s=0.05, run_s=0.1)}
    node = node_factory(plans, init_workers=2, run_workers=1, ready_buffer=2)
    await node.submit("a")
    await node.submit("b", timeout=0.3)
    result = await node.result("b")
    assert result.status == SessionStatus.COMPLETED, result.error
    assert result.timing["ready_wait"] > 0.3


async def test_model_time_counts_against_the_budget_by_default(node_factory) -> None:
    node = node_factory({"a": Plan(model_s=0.5, run_s=0.05)})
    await node.submit("a", timeout=0.3)
    result = await node.result("a")
    assert result.status == SessionStatus.TIMEOUT and "during run" in (result.error or "")


async def test_a_budget_that_leaves_model_time_out_waits_for_a_slow_engine(node_factory) -> None:
    # A model call of 0.5 s (a busy engine) in a 0.3 s budget: the harness's own 0.05 s fit.
    node = node_factory({"a": Plan(model_s=0.5, run_s=0.05)})
    await node.submit("a", timeout=0.3, counts_model_time=False)
    result = await node.result("a")
    assert result.status == SessionStatus.COMPLETED, result.error
    assert result.timing["run"] > 0.5


async def test_a_budget_that_leaves_model_time_out_still_bounds_the_harness(
    node_factory,
) -> None:
    node = node_factory({"a": Plan(model_s=0.4, run_s=5)})
    await node.submit("a", timeout=0.3, counts_model_time=False)
    result = await node.result("a")
    assert result.status == SessionStatus.TIMEOUT and "during run" in (result.error or "")
    assert result.failure == SessionFailure(kind="timeout", reason="budget_exhausted")
    assert 0.6 < result.timing["total"] < 1.5  # 0.3 s of its own after 0.4 s of the model's


async def test_budget_runs_out_in_init(node_factory) -> None:
    node = node_factory({"a": Plan(init_s=5)})
    await node.submit("a", timeout=0.1)
    result = await node.result("a")
    assert result.status == SessionStatus.TIMEOUT and "during init" in (result.error or "")
    assert result.failure == SessionFailure(kind="timeout", reason="budget_exhausted")
    assert result.metadata["reached_run"] is False


async def test_failures_become_error_results(node_factory) -> None:
    node = node_factory(
        {
            "boot": Plan(init_error=RuntimeError("bwrap missing")),
            "crash": Plan(run_error=RuntimeError("exit 3")),
            "post": Plan(post_error=ValueError("builder bug")),
        }
    )
    for sid in ("boot", "crash", "post"):
        await node.submit(sid)
    boot, crash, post = [await node.result(s) for s in ("boot", "crash", "post")]
    assert boot.status == SessionStatus.ERROR and "init failed: bwrap missing" in boot.error
    assert crash.status == SessionStatus.ERROR and "run failed: exit 3" in crash.error
    assert post.status == SessionStatus.ERROR and "builder bug" in post.error
    # A runtime that never started says nothing about the policy; a crashed harness does.
    assert boot.failure == SessionFailure(kind="infra", reason="runtime_start_failed")
    assert crash.failure == SessionFailure(kind="agent", reason="harness_failed")
    assert post.failure == SessionFailure(kind="infra", reason="postrun_failed")
    assert "post".ljust(16, "0") in node.journal.aborted
    assert len(node.results) == 3


@pytest.mark.parametrize("stage", ["queued", "init", "ready", "run", "postrun"])
async def test_cancel_at_any_stage(node_factory, stage: str) -> None:
    plans = {
        "blocker": Plan(init_s=0.3, run_s=0.3),
        "x": Plan(init_s=0.3 if stage == "init" else 0.0, run_s=5, post_s=5 * (stage == "postrun")),
    }
    node = node_factory(plans, init_workers=1, run_workers=1, ready_buffer=1)
    if stage in ("queued", "ready"):
        await node.submit("blocker")
    session = await node.submit("x")
    want = {
        "queued": "queued",
        "init": "initializing",
        "ready": "ready",
        "run": "running",
        "postrun": "postrun",
    }[stage]
    if stage == "postrun":
        node.plans["x"].run_s = 0.0
    for _ in range(200):
        if session.place == want:
            break
        await asyncio.sleep(0.005)
    assert session.place == want
    assert node.life.counts().model_dump()[want] >= 1  # counted where it is
    node.life.cancel(session.session_id)
    result = await node.result("x")
    assert result.status == SessionStatus.ERROR and result.error == CANCELLED
    assert result.failure == SessionFailure(kind="infra", reason="cancelled")
    assert result.timing["total"] < 1.0
    run_started = ("run", session.session_id) in node.journal.events
    assert run_started == (stage in ("run", "postrun"))


async def test_stop_cancels_unfinished_sessions() -> None:
    node = Node({"a": Plan(run_s=10)})
    node.life.start()
    await node.submit("a")
    await asyncio.sleep(0.02)
    await node.life.stop(grace_s=2)
    assert node.results[0].error == CANCELLED
    assert node.results[0].failure == SessionFailure(kind="infra", reason="cancelled")


async def test_an_error_result_without_a_failure_gets_one_a_completed_one_loses_it(
    node_factory,
) -> None:
    """The invariant holds whatever a SessionWork returns: ERROR/TIMEOUT carry a failure,
    COMPLETED never does."""
    node = node_factory({})
    stray = SessionFailure(kind="agent", reason="stray")

    def returning(status: SessionStatus, failure: SessionFailure | None, sid: str) -> Any:
        async def postrun(outcome: RunOutcome) -> SessionResult:
            return SessionResult(session_id=sid, task_id="t", status=status, failure=failure)

        return postrun

    for sid, status, failure in (
        ("e", SessionStatus.ERROR, None),
        ("c", SessionStatus.COMPLETED, stray),
    ):
        session = await node.submit(sid)
        session.work.postrun = returning(status, failure, session.session_id)  # type: ignore[union-attr,method-assign]
        await node.result(sid)
    errored, completed = node.results
    assert errored.status == SessionStatus.ERROR
    assert errored.failure == SessionFailure(kind="agent", reason="unspecified")
    assert completed.status == SessionStatus.COMPLETED and completed.failure is None
