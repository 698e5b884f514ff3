"""One session as a gateway node tracks it: where it is, its timings, how its stages ended.

Apart from the pools (:mod:`polar.gateway.node.lifecycle`) so that the stage bodies
(:mod:`polar.gateway.node.session_work`) and the pools share one record without either importing
the other's machinery. How a stage's ending becomes the session's status and failure is decided
here, once, from the session alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from polar.logs import log_event
from polar.schemas.node import NodeSessionInfo, SessionDispatch
from polar.schemas.task import SessionFailure, SessionResult, SessionStatus

# The lifecycle's logger name, kept where its session events have always been logged.
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
# A work whose ERROR result names no failure (a custom SessionWork): scored as the agent's.
UNSPECIFIED = SessionFailure(kind="agent", reason="unspecified")


class SessionWork(Protocol):
    """The stage bodies for one session (see :mod:`polar.gateway.node.session_work`)."""

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
    # Optional: ``model_seconds()``, how long the session's model calls have been with the
    # gateway; a task with ``timeout_counts_model_time: false`` gets that time back in RUN.


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

    def record_stage_failure(self, failure: Any, stage: str) -> None:
        """INIT or RUN ended by ``failure``: the status, error and failure it means."""
        outcome = self.outcome
        if outcome.cancelled:
            return
        own = getattr(failure, "failure", None)  # an exception that knows its kind
        if isinstance(failure, TimeoutError) and isinstance(own, SessionFailure):
            outcome.status = SessionStatus.TIMEOUT
            outcome.error = str(failure)
            outcome.failure = own
        elif isinstance(failure, TimeoutError):
            outcome.status = SessionStatus.TIMEOUT
            budget = self.dispatch.task.timeout_seconds
            outcome.error = f"the session budget of {budget:g}s ran out during {stage}"
            outcome.failure = BUDGET_EXHAUSTED
        else:
            outcome.status = SessionStatus.ERROR
            outcome.error = f"{stage} failed: {failure}"
            outcome.failure = _STAGE_FAILURES[stage]

    def record_postrun_failure(self, failure: Any, bound: float) -> None:
        """POST-RUN raised or ran past ``bound``: the session ends ERROR with the reason."""
        outcome = self.outcome
        if outcome.cancelled:
            return
        if isinstance(failure, TimeoutError):
            evaluating = self.status == SessionStatus.EVALUATING
            what = "evaluating" if evaluating else f"post-run ({self.status.value})"
            outcome.error = f"{what} ran past the evaluator's timeout_seconds of {bound:g}s"
            outcome.failure = EVALUATOR_TIMEOUT if evaluating else POSTRUN_TIMEOUT
            event = "session.postrun.timeout"
        else:
            outcome.error = f"post-run failed: {failure!r}"
            outcome.failure = POSTRUN_FAILED
            event = "session.postrun.failed"
        outcome.status = SessionStatus.ERROR
        self.log(
            event,
            f"post-run of session {self.session_id}: {outcome.error}",
            level=logging.WARNING,
            exc_info=failure if not isinstance(failure, TimeoutError | None) else None,
            error=outcome.error,
        )

    def log_stage_end(self, stage: str, failure: Any) -> None:
        """``session.<stage>.end``: how long the stage took and how it ended (``outcome`` ok,
        timeout, error or cancelled; the ``error`` when it failed)."""
        outcome = self.outcome
        if outcome.cancelled:
            ended = "cancelled"
        elif failure is None:
            ended = "ok"
        else:
            ended = "timeout" if isinstance(failure, TimeoutError) else "error"
        self.log(
            f"session.{stage}.end",
            f"session {self.session_id} {stage}: {ended}",
            seconds=round(self.seconds_in_place, 3),
            outcome=ended,
            error=outcome.error if ended != "ok" else None,
        )

    def bare_result(self) -> SessionResult:
        """The result of a session whose work gave none: its outcome and ids alone."""
        return SessionResult(
            session_id=self.session_id,
            task_id=self.task_id,
            status=self.outcome.status,
            node_id=self.node_id,
            error=self.outcome.error,
            failure=self.outcome.failure,
            sample_index=self.dispatch.sample_index,
        )
