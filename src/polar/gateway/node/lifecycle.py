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
:mod:`polar.gateway.node.session_work`, and each session's record (place, timings, what a stage's
ending means) in :mod:`polar.gateway.node.node_session`; this module only moves sessions between
stages, enforces the budget, and cancels. Every stage runs as its own asyncio task,
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
from typing import Any

from polar.errors import AlreadyRan, NodeDraining, NodeFull
from polar.gateway.config import NodeConfig
from polar.gateway.node.executors import node_evaluator_pool, route_default_executor
from polar.gateway.node.node_session import (
    BUDGET_EXHAUSTED,
    CANCELLED,
    CANCELLED_FAILURE,
    UNSPECIFIED,
    NodeSession,
    Place,
    RunOutcome,
    SessionWork,
    WorkFactory,
    log,
)
from polar.schemas.node import NodeStatus, SessionDispatch, StageCounts, Workers
from polar.schemas.task import SessionResult, SessionStatus, settle_failure
from polar.schemas.trajectory import Trajectory

__all__ = [
    "CANCELLED",
    "AlreadyRan",
    "Lifecycle",
    "NodeDraining",
    "NodeFull",
    "NodeSession",
    "Place",
    "RunOutcome",
    "SessionWork",
    "WorkFactory",
]

# How long a cancelled stage, or a teardown, may take before its worker moves on without it:
# a host read blocked in a thread cannot be cancelled and must not hold a worker slot.
RELEASE_GRACE_S = 10.0


class Lifecycle:
    """The pools of one node. ``on_finished`` receives every final SessionResult once;
    ``open_session`` makes an admitted session's key work (the gateway's registry)."""

    def __init__(
        self,
        config: NodeConfig,
        work_factory: WorkFactory,
        *,
        on_finished: Callable[[SessionResult], Awaitable[None]] | None = None,
        open_session: Callable[[NodeSession], Awaitable[None]] | None = None,
        known_ids: set[str] | None = None,
        node_url: str = "",
    ) -> None:
        self.config = config
        self.node_url = node_url
        self.work_factory = work_factory
        self.on_finished = on_finished
        self.open_session = open_session
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

    async def dispatch(self, dispatch: SessionDispatch) -> tuple[NodeSession, bool]:
        """Admit a session and open it (``open_session``: its key works, durably, before the
        dispatch is acknowledged), then queue it; a repeat of a known id returns it as it is
        (``created=False``). Raises AlreadyRan, NodeDraining or NodeFull if it cannot start.

        The session holds its place from admission on, so a dispatch arriving while this one
        opens is counted against it (one check, no undo); only an open that fails gives the
        place back, and the id may be dispatched again."""
        sid = dispatch.session_id
        existing = self._sessions.get(sid)
        if existing is not None:
            return existing, False
        if sid in self._known_ids:
            raise AlreadyRan(sid)
        if self.draining:
            raise NodeDraining(self.config.node_id)
        if len(self._active) >= self.config.queue_limit:
            raise NodeFull(self.config.node_id)
        session = NodeSession(dispatch=dispatch, node_id=self.config.node_id)
        session.work = self.work_factory(session)
        self._known_ids.add(sid)
        self._sessions[sid] = self._active[sid] = session
        if self.open_session is not None:
            try:
                await self.open_session(session)
            except BaseException:
                self._known_ids.discard(sid)
                self._sessions.pop(sid, None)
                self._active.pop(sid, None)
                raise
        self._init_q.put_nowait(session)
        session.log(
            "session.accepted",
            f"session {session.session_id} of task {session.task_id} accepted",
            sample_index=dispatch.sample_index,
        )
        return session, True

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
                session.record_postrun_failure(result, bound)
                await self._released(work.abort())
                built: Trajectory | None = getattr(work, "built", None)
                result = session.bare_result().model_copy(update={"trajectory": built})
            await self._finish(session, result)

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
            session.log_stage_end("init", None)
            return True
        session.record_stage_failure(failure, stage="init")
        session.log_stage_end("init", failure)
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
        failure = await self._stage(
            session, work.run(budget), budget_s=budget, paused_s=_model_clock(session, work)
        )
        if failure is not None:
            session.record_stage_failure(failure, stage="run")
        session.log_stage_end("run", failure)
        self._to_postrun(session)

    async def _stage(
        self,
        session: NodeSession,
        body: Coroutine[Any, Any, Any],
        budget_s: float | None,
        paused_s: Callable[[], float] | None = None,
    ) -> Any:
        """Run one stage body as its own task. Returns its value, or (not raised) the
        TimeoutError, CancelledError or exception that ended it. ``paused_s``: a clock of
        seconds that do not count against ``budget_s`` (the session's model calls)."""
        task = asyncio.create_task(body)
        session.stage_task = task
        seen = paused_s() if paused_s is not None else 0.0
        try:
            done, _ = await asyncio.wait({task}, timeout=budget_s)
            while not done and paused_s is not None and session.deadline is not None:
                # The budget ran out but for the seconds paused meanwhile: they are given back.
                now = paused_s()
                paused, seen = now - seen, now
                if paused <= 0:
                    break
                session.deadline += paused
                done, _ = await asyncio.wait({task}, timeout=session.remaining())
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

    def _to_postrun(self, session: NodeSession) -> None:
        session.move(Place.POSTRUN_QUEUED, SessionStatus.POST_RUN)
        self._post_q.put_nowait(session)

    # -- finishing -------------------------------------------------------------------------

    async def _finish_cancelled(self, session: NodeSession) -> None:
        if session.work is not None:
            await self._released(session.work.abort())
        await self._finish(session, session.bare_result())

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


def _model_clock(session: NodeSession, work: SessionWork) -> Callable[[], float] | None:
    """The session's model-call clock when its budget leaves that time out
    (``timeout_counts_model_time: false``) and its work keeps one."""
    if session.dispatch.task.timeout_counts_model_time:
        return None
    clock: Callable[[], float] | None = getattr(work, "model_seconds", None)
    return clock


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
