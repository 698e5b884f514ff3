"""What the bridges share: one trainer sample per session, and how failed sessions look.

TRL, slime and verl all take a fixed number of samples per prompt (the GRPO group), so a
session must become exactly one sample even when it yielded several traces (sub-agents,
breaks). The bridges take the session's main trace, the one with the most trainable tokens
(the agent's own chain; side chains are usually short), and report how many traces they left
out, so the loss of data is counted, never silent. The embedded trainer has no such limit and
trains on every trace.

A failed session still fills its slot. Its sample is made untrainable (``zero_advantage``: no
reward, mask all zero) or keeps its tokens with ``failure_reward`` (``penalize``). A session the
infrastructure failed (failure kind ``infra``: node lost, runtime failed to start, cancelled)
is always made untrainable with no reward when ``drop_infra_failures`` is on (the default):
it says nothing about the policy, so it must not score ``failure_reward`` against its group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from polar.schemas.task import SessionResult, SessionStatus, TaskResult
from polar.schemas.trajectory import Trace, TraceStats
from polar.trajectory.exporters.base import session_context

BridgeFailurePolicy = Literal["zero_advantage", "penalize"]


@dataclass
class SessionSampleRow:
    """One session's contribution to a trainer batch."""

    result: SessionResult
    trace: Trace | None
    reward: float | None
    trainable: bool
    left_out_traces: int
    session: dict[str, Any]

    @property
    def failed(self) -> bool:
        return self.result.status != SessionStatus.COMPLETED or self.result.reward is None

    @property
    def infra_failure(self) -> bool:
        """Failed for the infrastructure's sake, not the policy's."""
        failure = self.result.failure
        return failure is not None and failure.kind == "infra"


def main_trace(traces: Sequence[Trace]) -> Trace | None:
    """The trace with the most trainable tokens (the first on a tie)."""
    best: Trace | None = None
    for trace in traces:
        if best is None or sum(trace.loss_mask) > sum(best.loss_mask):
            best = trace
    return best


def session_rows(
    task: TaskResult,
    *,
    expected: int,
    on_failure: BridgeFailurePolicy = "zero_advantage",
    failure_reward: float = 0.0,
    drop_infra_failures: bool = True,
) -> list[SessionSampleRow]:
    """``expected`` rows for a task, in sample order; the rollout server reports every session,
    so fewer results is an error, not something to pad over. A failed row has reward None
    (its trainer leaves it out of the group's statistics) unless ``penalize`` applies to it."""
    ordered = sorted(task.results, key=lambda r: r.sample_index or 0)
    if len(ordered) != expected:
        raise ValueError(
            f"task {task.task_id!r} returned {len(ordered)} sessions, expected {expected}"
        )
    rows = []
    for result in ordered:
        trajectory = result.trajectory
        traces = list(trajectory.traces) if trajectory is not None else []
        trace = main_trace(traces)
        session = session_context(trajectory) if trajectory is not None else {}
        session.update(session_id=result.session_id, task_id=result.task_id)
        session["status"] = result.status.value
        if result.failure is not None:
            session["failure_kind"] = result.failure.kind
        row = SessionSampleRow(
            result=result,
            trace=trace,
            reward=result.reward,
            trainable=trace is not None and any(trace.loss_mask),
            left_out_traces=max(0, len(traces) - 1),
            session=session,
        )
        if row.failed:
            dropped = drop_infra_failures and row.infra_failure
            if on_failure == "penalize" and trace is not None and not dropped:
                row.reward = failure_reward
            else:
                row.reward = None
                row.trainable = False
        rows.append(row)
    return rows


def untrainable(trace: Trace) -> Trace:
    """The same tokens with an all-zero loss mask (a failed session's placeholder)."""
    untrained = trace.with_stats(TraceStats(trainable=False))
    return untrained.model_copy(update={"loss_mask": [0] * len(trace.response_ids)})
