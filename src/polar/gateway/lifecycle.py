"""A gateway node's session lifecycle: isolated worker pools joined by queues.

::

    dispatch ─▶ [init queue] ─▶ INIT workers ─▶ [READY buffer, bounded] ─▶ RUN workers
                                                                            │
                 result ◀─ POSTRUN workers (build, evaluate, teardown) ◀─ [postrun queue]

Each pool has its own worker count, so CPU-heavy preparation (starting sandboxes, prepare steps)
happens while run slots are busy, and a prepared runtime is waiting the moment a slot frees. A
READY slot is taken when INIT starts and given back when a run worker takes the session, so at
most ``ready_buffer`` runtimes are being prepared or waiting prepared. With ``ready_buffer: 0``
there is no buffer: a run worker does INIT itself (the baseline the benchmark compares against).

One time budget per session starts when INIT starts. What each stage does lives in
:mod:`polar.gateway.session_work`; this module only moves sessions between stages, keeps their
status and timings, enforces the budget, and cancels. Every stage runs as its own asyncio task,
so cancelling a session (or its budget running out) never disturbs the worker that runs it.

Every move is a log event with the session, task and node ids (``session.accepted``,
``session.init.start`` / ``.end``, ``session.ready``, ``session.run.start`` / ``.end``,
``session.postrun.start``, ``session.finished``; see docs/observability.md#logs).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from polar.errors import AlreadyRan, NodeDraining, NodeFull
from polar.gateway.config import NodeConfig
from polar.gateway.executors import node_evaluator_pool, route_default_executor
from polar.logs import log_event
from polar.schemas.node import (
    NodeSessionInfo,
    NodeStatus,
    SessionDispatch,
    StageCounts,
    Workers,
)
from polar.schemas.task import SessionFailure, SessionResult, SessionStatus, settle_failure
from polar.schemas.trajectory import Trajectory

log = logging.getLogger("polar.gateway.lifecycle")

CANCELLED = "cancelled"
# Why a session did not complete, for trainers (SessionResult.failure): the stage decides.
CANCELLED_FAILURE = SessionFailure(kind="infra", reason=CANCELLED)
_STAGE_FAILURES = {
    "init": SessionFailure(kind="infra", reason="runtime_start_failed"),
    "run": SessionFailure(kind="agent", reason="harness_failed"),
}
BUDGET_EXHAUSTED = SessionFailure(kind="timeout", reason="budget_exhausted")
POSTRUN_FAILED = SessionFailure(kind="infra", reason="postrun_failed")
# POST-RUN past the evaluator's timeout_seconds: the grader's fault while it grades, else ours.
EVALUATOR_TIMEOUT = SessionFailure(kind="evaluator", reason="evaluator_timeout")
POSTRUN_TIMEOUT = SessionFailure(kind="infra", reason="postrun_timeout")
# How long a cancelled stage, or a teardown, may take before its worker moves on without it:
# a host read blocked in a thread cannot be cancelled and must not hold a worker slot.
RELEASE_GRACE_S = 10.0
# A work whose ERROR result names no failure (a custom SessionWork): scored as the agent's.
UNSPECIFIED = SessionFailure(kind="agent", reason="unspecified")


class SessionWork(Protocol):
    """The stage bodies for one session (see :mod:`polar.gateway.session_work`)."""

    async def init(self) -> None:
        """Start the runtime and run the prepare steps."""

    async def run(self, budget_s: float) -> None:
        """Run the harness within ``budget_s`` seconds; raise if it failed."""

    async def postrun(self, outcome: RunOutcome) -> SessionResult:
        """Build the trajectory, evaluate, tear down."""

    async def abort(self) -> None:
        """Release whatever was started (the runtime), quickly; safe to call at any point."""

    # Optional: ``built``, the trajectory once POST-RUN has built it. A POST-RUN that fails or
    # runs past its bound after that (a wedged evaluator) still returns it, with no reward.


WorkFactory = Callable[["NodeSession"], SessionWork]


class Place(StrEnum):
    """Where a session can wait or work (the values name the fields of StageCounts)."""

    QUEUED = "queued"
    INITIALIZING = "initializing"
    READY = "ready"
    RUNNING = "running"
    POSTRUN_QUEUED = "postrun_queued"
    POSTRUN = "postrun"

    @property
    def timing_key(self) -> str:
        """The SessionResult.timing key this place's seconds are booked to."""
        return _TIMING_KEYS[self]


_TIMING_KEYS = {
    Place.QUEUED: "queued",
    Place.INITIALIZING: "init",
    Place.READY: "ready_wait",
    Place.RUNNING: "run",
    Place.POSTRUN_QUEUED: "postrun_wait",
    Place.POSTRUN: "postrun",
}


@dataclass
class RunOutcome:
    """How the session left the run path; POSTRUN may still turn COMPLETED into ERROR."""

    status: SessionStatus = SessionStatus.COMPLETED
    error: str | None = None
    failure: SessionFailure | None = None
    reached_run: bool = False
    cancelled: bool = False


@dataclass
class NodeSession:
    """One dispatched session as this node tracks it."""

    dispatch: SessionDispatch
    node_id: str
    status: SessionStatus = SessionStatus.REGISTERED
    place: Place = Place.QUEUED
    accepted_at: float = field(default_factory=time.monotonic)
    stage_started_at: float = field(default_factory=time.time)
    deadline: float | None = None
    timing: dict[str, float] = field(default_factory=dict)
    outcome: RunOutcome = field(default_factory=RunOutcome)
    result: SessionResult | None = None
    work: SessionWork | None = None
    stage_task: asyncio.Task[Any] | None = None
    closing: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)
    _since: float = field(default_factory=time.monotonic)

    @property
    def session_id(self) -> str:
        return self.dispatch.session_id

    @property
    def task_id(self) -> str:
        return self.dispatch.task.task_id

    @property
    def finished(self) -> bool:
        return self.result is not None

    @property
    def skip(self) -> bool:
        """Finished, or being finished outside the pools (cancelled while queued)."""
        return self.closing or self.finished

    @property
    def seconds_in_place(self) -> float:
        """How long the session has been where it is, not yet booked to its timing."""
        return time.monotonic() - self._since

    def move(self, place: Place, status: SessionStatus) -> None:
        """Go to ``place``; the seconds spent in the previous place are booked to its timing."""
        self._book()
        self.place = place
        self.set_status(status)

    def set_status(self, status: SessionStatus) -> None:
        """A finer status within the same place (BUILDING, EVALUATING during post-run)."""
        self.status = status
        self.stage_started_at = time.time()

    def close_timing(self) -> None:
        """Book the current place's seconds and the session's total, as it finishes."""
        self._book()
        self.timing["total"] = round(time.monotonic() - self.accepted_at, 6)

    def _book(self) -> None:
        now = time.monotonic()
        key = self.place.timing_key
        self.timing[key] = round(self.timing.get(key, 0.0) + now - self._since, 6)
        self._since = now

    def remaining(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def log(
        self,
        event: str,
        message: str,
        *,
        level: int = logging.INFO,
        logger: logging.Logger = log,
        **fields: Any,
    ) -> None:
        """A log event about this session, with its session, task and node ids."""
        log_event(
            logger,
            event,
            message,
            level=level,
            session_id=self.session_id,
            task_id=self.task_id,
            node_id=self.node_id,
            **fields,
        )

    def info(self) -> NodeSessionInfo:
        return NodeSessionInfo(
            session_id=self.session_id,
            task_id=self.task_id,
            node_id=self.node_id,
            status=self.status,
            stage_started_at=self.stage_started_at,
            timing=dict(self.timing),
            cancelled=self.outcome.cancelled,
            error=self.result.error if self.result else self.outcome.error,
        )


class Lifecycle:
    """The pools of one node. ``on_finished`` receives every final SessionResult once."""

    def __init__(
        self,
        config: NodeConfig,
        work_factory: WorkFactory,
        *,
        on_finished: Callable[[SessionResult], Awaitable[None]] | None = None,
        known_ids: set[str] | None = None,
        node_url: str = "",
    ) -> None:
        self.config = config
        self.node_url = node_url
        self.work_factory = work_factory
        self.on_finished = on_finished
        self.draining = False
        self.finished_count = 0
        self._known_ids = set(known_ids or ())
        self._sessions: OrderedDict[str, NodeSession] = OrderedDict()
        self._active: dict[str, NodeSession] = {}
        self._init_q: asyncio.Queue[NodeSession] = asyncio.Queue()
        self._ready_q: asyncio.Queue[NodeSession] = asyncio.Queue()
        # A slot is taken before INIT and given back when a run worker takes the session, so
        # at most ``ready_buffer`` runtimes are being prepared or waiting prepared.
        self._ready_slots = asyncio.Semaphore(max(config.ready_buffer, 1))
        self._post_q: asyncio.Queue[NodeSession] = asyncio.Queue()
        self._workers: list[asyncio.Task[None]] = []
        self._side_tasks: set[asyncio.Task[Any]] = set()
        # An evaluator's blocking work (a read of the workspace, a grader's waits) has its own
        # threads: a wedged evaluator costs evaluator capacity, never the loop's executor.
        self._evaluator_threads = ThreadPoolExecutor(
            config.evaluator_threads, thread_name_prefix=f"polar-evaluator-{config.node_id}"
        )

    # -- start / stop --------------------------------------------------------------------

    def start(self) -> None:
        c = self.config
        route_default_executor()
        pools: list[tuple[str, Callable[[], Coroutine[Any, Any, None]], int]]
        if c.ready_buffer > 0:
            pools = [
                ("init", self._init_worker, c.init_workers),
                ("run", self._run_worker, c.run_workers),
            ]
        else:
            pools = [("run", self._inline_run_worker, c.run_workers)]
        pools.append(("postrun", self._postrun_worker, c.postrun_workers))
        for name, loop, count in pools:
            for i in range(count):
                self._workers.append(asyncio.create_task(loop(), name=f"{name}-worker-{i}"))

    async def stop(self, grace_s: float = 10.0) -> None:
        """Cancel every unfinished session (its runtime is stopped), then the workers."""
        active = list(self._active.values())
        for session in active:
            self.cancel(session.session_id)
        if active:
            waiters = [asyncio.ensure_future(s.done.wait()) for s in active]
            await asyncio.wait(waiters, timeout=grace_s)
            for waiter in waiters:
                waiter.cancel()
        tasks = self._workers + list(self._side_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # A thread still blocked (a wedged evaluator) is left to end alone; none waits for it.
        self._evaluator_threads.shutdown(wait=False, cancel_futures=True)

    # -- the node API ----------------------------------------------------------------------

    def dispatch(self, dispatch: SessionDispatch) -> tuple[NodeSession, bool]:
        """Accept a session; a repeat of a known id returns it as it is (``created=False``)."""
        existing = self._sessions.get(dispatch.session_id)
        if existing is not None:
            return existing, False
        self.check_admission(dispatch.session_id)
        session = NodeSession(dispatch=dispatch, node_id=self.config.node_id)
        session.work = self.work_factory(session)
        self._known_ids.add(session.session_id)
        self._sessions[session.session_id] = session
        self._active[session.session_id] = session
        self._init_q.put_nowait(session)
        session.log(
            "session.accepted",
            f"session {session.session_id} of task {session.task_id} accepted",
            sample_index=dispatch.sample_index,
        )
        return session, True

    def check_admission(self, session_id: str) -> None:
        """Raise AlreadyRan, NodeDraining or NodeFull if a new ``session_id`` cannot start."""
        if session_id in self._known_ids:
            raise AlreadyRan(session_id)
        if self.draining:
            raise NodeDraining(self.config.node_id)
        if len(self._active) >= self.config.queue_limit:
            raise NodeFull(self.config.node_id)

    def get(self, session_id: str) -> NodeSession | None:
        return self._sessions.get(session_id)

    def sessions(self) -> list[NodeSession]:
        return list(self._sessions.values())

    def cancel(self, session_id: str) -> NodeSession | None:
        """Stop a session at whatever stage it is in; it finishes as ERROR ("cancelled")."""
        session = self._sessions.get(session_id)
        if session is None or session.finished or session.outcome.cancelled:
            return session
        session.outcome.cancelled = True
        session.outcome.status = SessionStatus.ERROR
        session.outcome.error = CANCELLED
        session.outcome.failure = CANCELLED_FAILURE
        session.log(
            "session.cancel",
            f"session {session_id} cancelled while {session.place}",
            place=session.place.value,
        )
        if session.stage_task is not None and not session.stage_task.done():
            session.stage_task.cancel()
        elif session.place in (Place.QUEUED, Place.READY, Place.POSTRUN_QUEUED):
            # Waiting in a queue: finish now; the worker that dequeues it skips it.
            session.closing = True
            self._spawn(self._finish_cancelled(session))
        return session

    def drain(self) -> None:
        self.draining = True

    def counts(self) -> StageCounts:
        places = Counter(session.place for session in self._active.values())
        return StageCounts(
            queued=places[Place.QUEUED],
            initializing=places[Place.INITIALIZING],
            ready=places[Place.READY],
            running=places[Place.RUNNING],
            postrun_queued=places[Place.POSTRUN_QUEUED],
            postrun=places[Place.POSTRUN],
        )

    def status(self, *, paused: bool = False, policy_version: int = 0) -> NodeStatus:
        c = self.config
        return NodeStatus(
            node_id=c.node_id,
            url=self.node_url,
            draining=self.draining,
            paused=paused,
            policy_version=policy_version,
            workers=Workers(
                init=c.init_workers,
                run=c.run_workers,
                postrun=c.postrun_workers,
                ready_buffer=c.ready_buffer,
                queue_limit=c.queue_limit,
            ),
            stages=self.counts(),
            finished=self.finished_count,
        )

    async def wait(self, session_id: str) -> SessionResult:
        session = self._sessions[session_id]
        await session.done.wait()
        assert session.result is not None
        return session.result

    # -- workers ---------------------------------------------------------------------------

    async def _init_worker(self) -> None:
        while True:
            await self._ready_slots.acquire()
            session = await self._init_q.get()
            if not session.skip and await self._init(session):
                session.move(Place.READY, SessionStatus.READY)
                session.log("session.ready", f"session {session.session_id} ready for a run slot")
                self._ready_q.put_nowait(session)
            else:
                self._ready_slots.release()

    async def _run_worker(self) -> None:
        while True:
            session = await self._ready_q.get()
            self._ready_slots.release()
            if not session.skip:
                await self._run(session)

    async def _inline_run_worker(self) -> None:
        """No READY buffer: INIT runs on the run slot, then the harness."""
        while True:
            session = await self._init_q.get()
            if not session.skip and await self._init(session):
                await self._run(session)

    async def _postrun_worker(self) -> None:
        while True:
            session = await self._post_q.get()
            if session.skip:
                continue
            session.move(Place.POSTRUN, SessionStatus.POST_RUN)
            session.log("session.postrun.start", f"session {session.session_id} in post-run")
            work = session.work
            assert work is not None
            bound = session.dispatch.task.evaluator.timeout_seconds
            with node_evaluator_pool(self._evaluator_threads):
                result = await self._stage(session, work.postrun(session.outcome), bound)
            if not isinstance(result, SessionResult):
                self._fail_postrun(session, result, bound)
                await self._released(work.abort())
                built: Trajectory | None = getattr(work, "built", None)
                result = self._bare_result(session).model_copy(update={"trajectory": built})
            await self._finish(session, result)

    def _fail_postrun(self, session: NodeSession, failure: Any, bound: float) -> None:
        """POST-RUN raised or ran past ``bound``: the session ends ERROR with the reason."""
        outcome = session.outcome
        if outcome.cancelled:
            return
        if isinstance(failure, TimeoutError):
            evaluating = session.status == SessionStatus.EVALUATING
            what = "evaluating" if evaluating else f"post-run ({session.status.value})"
            outcome.error = f"{what} ran past the evaluator's timeout_seconds of {bound:g}s"
            outcome.failure = EVALUATOR_TIMEOUT if evaluating else POSTRUN_TIMEOUT
            event = "session.postrun.timeout"
        else:
            outcome.error = f"post-run failed: {failure!r}"
            outcome.failure = POSTRUN_FAILED
            event = "session.postrun.failed"
        outcome.status = SessionStatus.ERROR
        session.log(
            event,
            f"post-run of session {session.session_id}: {outcome.error}",
            level=logging.WARNING,
            exc_info=failure if not isinstance(failure, TimeoutError | None) else None,
            error=outcome.error,
        )

    # -- stages ----------------------------------------------------------------------------

    async def _init(self, session: NodeSession) -> bool:
        """INIT, with the session's budget starting now (it pauses in READY); False sends it
        to post-run."""
        session.deadline = time.monotonic() + session.dispatch.task.timeout_seconds
        session.move(Place.INITIALIZING, SessionStatus.INITIALIZING)
        session.log("session.init.start", f"session {session.session_id} starting its runtime")
        work = session.work
        assert work is not None
        failure = await self._stage(session, work.init(), budget_s=session.remaining())
        if failure is None and not session.outcome.cancelled:
            self._log_stage_end(session, "init", None)
            return True
        self._fail(session, failure, stage="init")
        self._log_stage_end(session, "init", failure)
        self._to_postrun(session)
        return False

    async def _run(self, session: NodeSession) -> None:
        work = session.work
        assert work is not None
        if session.place == Place.READY and session.deadline is not None:
            # A prepared runtime waiting for a run slot is the node's queue, not the session's
            # work: the budget pauses there, so a deep READY buffer never times sessions out.
            session.deadline += session.seconds_in_place
        budget = session.remaining()
        if budget <= 0:
            session.outcome.status = SessionStatus.TIMEOUT
            session.outcome.error = "the session budget ran out before a run slot was free"
            session.outcome.failure = BUDGET_EXHAUSTED
            session.log(
                "session.run.skipped",
                f"session {session.session_id} timed out before a run slot was free",
                status=session.outcome.status.value,
                error=session.outcome.error,
            )
            self._to_postrun(session)
            return
        session.move(Place.RUNNING, SessionStatus.RUNNING)
        session.outcome.reached_run = True
        session.log(
            "session.run.start",
            f"session {session.session_id} running its harness",
            budget_s=round(budget, 3),
        )
        failure = await self._stage(session, work.run(budget), budget_s=budget)
        if failure is not None:
            self._fail(session, failure, stage="run")
        self._log_stage_end(session, "run", failure)
        self._to_postrun(session)

    async def _stage(
        self, session: NodeSession, body: Coroutine[Any, Any, Any], budget_s: float | None
    ) -> Any:
        """Run one stage body as its own task. Returns its value, or (not raised) the
        TimeoutError, CancelledError or exception that ended it."""
        task = asyncio.create_task(body)
        session.stage_task = task
        try:
            done, _ = await asyncio.wait({task}, timeout=budget_s)
            if not done:
                task.cancel()
                await self._released(task)
                return TimeoutError()
            if task.cancelled():
                return asyncio.CancelledError()
            exc = task.exception()
            return exc if exc is not None else task.result()
        finally:
            session.stage_task = None

    def _fail(self, session: NodeSession, failure: Any, stage: str) -> None:
        outcome = session.outcome
        if outcome.cancelled:
            return
        own = getattr(failure, "failure", None)  # an exception that knows its kind
        if isinstance(failure, TimeoutError) and isinstance(own, SessionFailure):
            outcome.status = SessionStatus.TIMEOUT
            outcome.error = str(failure)
            outcome.failure = own
        elif isinstance(failure, TimeoutError):
            outcome.status = SessionStatus.TIMEOUT
            budget = session.dispatch.task.timeout_seconds
            outcome.error = f"the session budget of {budget:g}s ran out during {stage}"
            outcome.failure = BUDGET_EXHAUSTED
        else:
            outcome.status = SessionStatus.ERROR
            outcome.error = f"{stage} failed: {failure}"
            outcome.failure = _STAGE_FAILURES[stage]

    @staticmethod
    def _log_stage_end(session: NodeSession, stage: str, failure: Any) -> None:
        """``session.<stage>.end``: how long the stage took and how it ended (``outcome`` ok,
        timeout, error or cancelled; the ``error`` when it failed)."""
        outcome = session.outcome
        if outcome.cancelled:
            ended = "cancelled"
        elif failure is None:
            ended = "ok"
        else:
            ended = "timeout" if isinstance(failure, TimeoutError) else "error"
        session.log(
            f"session.{stage}.end",
            f"session {session.session_id} {stage}: {ended}",
            seconds=round(session.seconds_in_place, 3),
            outcome=ended,
            error=outcome.error if ended != "ok" else None,
        )

    def _to_postrun(self, session: NodeSession) -> None:
        session.move(Place.POSTRUN_QUEUED, SessionStatus.POST_RUN)
        self._post_q.put_nowait(session)

    # -- finishing -------------------------------------------------------------------------

    async def _finish_cancelled(self, session: NodeSession) -> None:
        if session.work is not None:
            await self._released(session.work.abort())
        await self._finish(session, self._bare_result(session))

    @staticmethod
    async def _released(work: Awaitable[Any]) -> None:
        """Wait for ``work`` (a cancelled stage, a teardown) at most :data:`RELEASE_GRACE_S`;
        past that it goes on alone (its outcome retrieved, never raised) and the worker is
        free again."""
        task = asyncio.ensure_future(work)
        done, _ = await asyncio.wait({task}, timeout=RELEASE_GRACE_S)
        if not done:
            log.warning(
                "a stage or teardown outlived its grace of %gs; left behind", RELEASE_GRACE_S
            )
        task.add_done_callback(_retrieve)

    def _bare_result(self, session: NodeSession) -> SessionResult:
        return SessionResult(
            session_id=session.session_id,
            task_id=session.task_id,
            status=session.outcome.status,
            node_id=session.node_id,
            error=session.outcome.error,
            failure=session.outcome.failure,
            sample_index=session.dispatch.sample_index,
        )

    async def _finish(self, session: NodeSession, result: SessionResult) -> None:
        if session.finished:
            return
        session.close_timing()
        result = settle_failure(result, session.outcome.failure or UNSPECIFIED)
        result = result.model_copy(update={"timing": {**session.timing, **result.timing}})
        session.result = result
        session.set_status(result.status)
        self._active.pop(session.session_id, None)
        self.finished_count += 1
        session.done.set()
        self._evict()
        session.log(
            "session.finished",
            f"session {session.session_id} finished: {result.status.value}",
            status=result.status.value,
            reward=result.reward,
            error=result.error,
            failure_kind=result.failure.kind if result.failure else None,
            seconds=result.timing.get("total"),
        )
        if self.on_finished is not None:
            try:
                await self.on_finished(result)
            except Exception as exc:
                session.log(
                    "session.handoff_failed",
                    f"handing on the result of {session.session_id} failed",
                    level=logging.ERROR,
                    exc_info=True,
                    error=repr(exc),
                )

    def _evict(self) -> None:
        extra = len(self._sessions) - len(self._active) - self.config.keep_finished
        if extra <= 0:
            return
        for sid in [sid for sid, s in self._sessions.items() if s.finished][:extra]:
            del self._sessions[sid]

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
