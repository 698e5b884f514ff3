"""Run turn-reward hooks over a session and align their scores with the trace tokens."""

from __future__ import annotations

from collections.abc import Sequence

from polar.capture.records import CaptureRecord
from polar.schemas.trajectory import Trajectory, TrajectoryStats, TurnReward
from polar.turn_rewards.base import TurnRewardHook, TurnScore, session_turns

Scores = dict[str, list[tuple[str, TurnScore]]]
"""Completion id -> (hook name, score) for every scored call."""


async def score_session(
    hooks: Sequence[TurnRewardHook], records: Sequence[CaptureRecord]
) -> Scores:
    """Every hook's score for every call it scored (side calls included; traces decide)."""
    scores: Scores = {}
    for turn in session_turns(records):
        for hook in hooks:
            result = await hook.score(turn)
            if result is not None:
                scores.setdefault(turn.call.completion_id, []).append((hook.spec.strategy, result))
    return scores


def attach_turn_rewards(trajectory: Trajectory, scores: Scores) -> int:
    """Put each score on the trace holding its call, over the call's sampled tokens, and state
    their number as the trajectory's ``turn_rewards``.

    Returns how many turn rewards were attached. ``call_spans`` (from the builder) locate each
    call's sampled ids in its trace's response.
    """
    attached = 0
    for trace in trajectory.traces:
        stats = trace.stats
        for cid, (start, end) in zip(stats.completion_ids, stats.call_spans, strict=True):
            for source, score in scores.get(cid, []):
                trace.turn_rewards.append(
                    TurnReward(
                        start=start,
                        end=end,
                        reward=score.reward,
                        source=source,
                        completion_id=cid,
                        details=score.details,
                    )
                )
                attached += 1
    trajectory.metadata = trajectory.with_stats(TrajectoryStats(turn_rewards=attached)).metadata
    return attached
