"""Turn-level advantages: the session's advantage plus each turn's centred per-turn reward.

For a token t sampled by call c of a trace in group g (the task's sessions)::

    A_t = A_session + w * (r_c - b_g)

where ``A_session`` is the group-relative advantage every trace of the session shares, ``r_c``
the sum of the turn rewards on call c (``Trace.turn_rewards``; a call no hook scored counts
``b_g``, so its bonus is 0), ``b_g`` the mean of ``r_c`` over the group's scored calls, and
``w`` is ``advantage.turn_reward_weight``. Traces whose session gets no reward (zeroed
failures) get no bonus either.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace

from polar.schemas.task import SessionResult
from polar.schemas.trajectory import Trace
from polar.training.advantages import ScoredTrace


def with_turn_credit(scored: Sequence[ScoredTrace], weight: float) -> list[ScoredTrace]:
    """``scored`` with a per-token bonus on every trace holding scored turns."""
    sums = [_call_rewards(s.trace) if s.reward is not None else {} for s in scored]
    pooled: dict[str, list[float]] = defaultdict(list)
    for s, rewards in zip(scored, sums, strict=True):
        pooled[s.group_id] += [r for r, _ in rewards.values()]
    baseline = {g: math.fsum(v) / len(v) for g, v in pooled.items() if v}
    out = []
    for s, rewards in zip(scored, sums, strict=True):
        if not rewards:
            out.append(s)
            continue
        bonus = [0.0] * len(s.trace.response_ids)
        for reward, (start, end) in rewards.values():
            bonus[start:end] = [weight * (reward - baseline[s.group_id])] * (end - start)
        out.append(replace(s, token_bonus=tuple(bonus)))
    return out


def _call_rewards(trace: Trace) -> dict[str, tuple[float, tuple[int, int]]]:
    """Completion id -> (summed turn reward, its sampled span)."""
    found: dict[str, tuple[float, tuple[int, int]]] = {}
    for turn in trace.turn_rewards:
        total, span = found.get(turn.completion_id, (0.0, (turn.start, turn.end)))
        found[turn.completion_id] = (total + turn.reward, span)
    return found


def turn_reward_report(results: Iterable[SessionResult]) -> dict[str, float | int]:
    """What the per-turn hooks said about some sessions: agent calls, calls scored, scored
    calls whose summed reward is negative (with ``tool_errors``: a failed tool call), the mean
    summed reward of the scored ones, and sessions with no scored call at all (with
    ``tool_errors``: no tool call; such a session escapes every turn penalty, the shortcut a
    turn-level penalty invites). Reported with or without turn-level credit."""
    calls = unscored = 0
    rewards: list[float] = []
    for result in results:
        if result.trajectory is None:
            continue
        found = [r for t in result.trajectory.traces for r, _ in _call_rewards(t).values()]
        calls += sum(t.stats.num_calls for t in result.trajectory.traces)
        unscored += not found
        rewards += found
    return {
        "calls": calls,
        "scored": len(rewards),
        "negative": sum(r < 0 for r in rewards),
        "mean": math.fsum(rewards) / len(rewards) if rewards else 0.0,
        "sessions_unscored": unscored,
    }
