"""GRPO group-relative advantages over the sessions of a task, and what failed sessions get.

A task runs as ``num_samples`` sessions: one group. Each session has one reward (from the
evaluator, broadcast to its traces) and its advantage is that reward against the group's
baseline (the mean, or with ``leave_one_out`` the mean of the other sessions), optionally divided
by the group's reward std. The baseline counts sessions, never traces, so a session that split
into several traces (sub-agents, breaks) does not pull the baseline toward itself. When the
evaluator scored traces one by one (their rewards differ from the session's), each trace is
measured against its session's baseline.

Sessions that did not finish cleanly are never folded in silently; each status has a policy:

- ``drop``: left out of the baseline and of the loss;
- ``zero_advantage``: left out of the baseline, kept in the batch with advantage 0 (for trainers
  that need fixed group shapes, and so their tokens still count in the normaliser);
- ``penalize``: counted as a normal sample whose reward is ``failure_reward``.

A session whose failure kind is ``infra`` (node lost, runtime failed to start, cancelled) says
nothing about the policy: with ``drop_infra_failures`` (the default) it is dropped whatever the
policy, so it neither scores 0 against its group nor pulls the baseline.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from polar.schemas.task import SessionResult, SessionStatus
from polar.schemas.trajectory import Trace
from polar.training.config import AdvantageConfig, FailurePolicy

COMPLETED = "COMPLETED"
TIMEOUT = "TIMEOUT"
ERROR = "ERROR"


@dataclass(frozen=True)
class SessionSample:
    """One finished session as the advantage estimator sees it."""

    session_id: str
    group_id: str
    status: str
    reward: float | None
    traces: tuple[Trace, ...] = ()
    passed: bool | None = None
    failure_kind: str | None = None
    """``SessionResult.failure.kind`` (infra, agent, evaluator, timeout) when it failed."""


@dataclass(frozen=True)
class ScoredTrace:
    """A trace ready for the loss: its session, its group and its advantage."""

    trace: Trace
    session_id: str
    group_id: str
    advantage: float
    reward: float | None
    token_bonus: tuple[float, ...] | None = None
    """Per response token, added to ``advantage`` (turn-level credit; see turn_credit.py)."""

    @property
    def trainable_tokens(self) -> int:
        return sum(self.trace.loss_mask)


@dataclass
class AdvantageReport:
    """What happened to every session, so nothing is dropped or zeroed unseen."""

    sessions: int = 0
    groups: int = 0
    scored: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    zeroed: Counter[str] = field(default_factory=Counter)
    penalized: Counter[str] = field(default_factory=Counter)
    flat_groups: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "sessions": self.sessions,
            "groups": self.groups,
            "scored": self.scored,
            "dropped": dict(self.dropped),
            "zeroed": dict(self.zeroed),
            "penalized": dict(self.penalized),
            "flat_groups": self.flat_groups,
        }


def samples_from_results(results: Iterable[SessionResult]) -> list[SessionSample]:
    """Session samples from rollout results; the group is ``group_id`` if set, else the task."""
    samples = []
    for result in results:
        trajectory = result.trajectory
        traces = tuple(trajectory.traces) if trajectory is not None else ()
        group = trajectory.stats.group_id if trajectory is not None else None
        reward = result.reward
        if reward is None:
            rewards = [t.reward for t in traces if t.reward is not None]
            if traces and len(rewards) == len(traces):
                reward = sum(rewards) / len(rewards)
        samples.append(
            SessionSample(
                session_id=result.session_id,
                group_id=str(group if group is not None else result.task_id),
                status=_status(result.status),
                reward=reward,
                traces=traces,
                passed=result.passed,
                failure_kind=result.failure.kind if result.failure else None,
            )
        )
    return samples


def group_advantages(
    rewards: Sequence[float],
    *,
    std_normalize: bool = True,
    leave_one_out: bool = False,
    eps: float = 1e-6,
) -> list[float]:
    """Advantages of one group's rewards (they sum to zero)."""
    return [
        _advantage(r, b, s, std_normalize, eps)
        for r, (b, s) in zip(rewards, _baselines(rewards, leave_one_out), strict=True)
    ]


def compute_advantages(
    samples: Sequence[SessionSample], config: AdvantageConfig | None = None
) -> tuple[list[ScoredTrace], AdvantageReport]:
    """Every trace that takes part in the update, with its advantage, and the report."""
    config = config or AdvantageConfig()
    report = AdvantageReport(sessions=len(samples))
    groups: dict[str, list[tuple[SessionSample, float | None]]] = defaultdict(list)
    for sample in samples:
        kind = _kind(sample)
        if kind is None:
            groups[sample.group_id].append((sample, sample.reward))
            continue
        if sample.failure_kind == "infra" and config.drop_infra_failures:
            report.dropped["infra"] += 1
            continue
        policy: FailurePolicy = config.on_timeout if kind == "timeout" else config.on_error
        if policy == "drop":
            report.dropped[kind] += 1
        elif policy == "zero_advantage":
            report.zeroed[kind] += 1
            groups[sample.group_id].append((sample, None))
        else:
            report.penalized[kind] += 1
            groups[sample.group_id].append((sample, config.failure_reward))
    report.groups = len(groups)
    scored: list[ScoredTrace] = []
    for members in groups.values():
        counted = [(s, r) for s, r in members if r is not None]
        rewards = [r for _, r in counted]
        baselines = dict(
            zip(
                (s.session_id for s, _ in counted),
                _baselines(rewards, config.leave_one_out),
                strict=True,
            )
        )
        if len(rewards) > 1 and max(rewards) == min(rewards):
            report.flat_groups += 1
        for sample, reward in members:
            penalized = reward is not None and _kind(sample) is not None
            for trace in sample.traces:
                if reward is None:
                    scored.append(ScoredTrace(trace, sample.session_id, sample.group_id, 0.0, None))
                    continue
                own = reward if penalized or trace.reward is None else trace.reward
                base, std = baselines[sample.session_id]
                advantage = _advantage(own, base, std, config.std_normalize, config.eps)
                scored.append(
                    ScoredTrace(trace, sample.session_id, sample.group_id, advantage, own)
                )
    report.scored = len(scored)
    if config.turn_reward_weight:
        from polar.training.turn_credit import with_turn_credit

        scored = with_turn_credit(scored, config.turn_reward_weight)
    return scored, report


def _kind(sample: SessionSample) -> str | None:
    """None for a usable session, else which failure policy applies."""
    if sample.status == TIMEOUT:
        return "timeout"
    if sample.status != COMPLETED:
        return "error"
    if sample.reward is None:
        return "error"
    return None


def _baselines(rewards: Sequence[float], leave_one_out: bool) -> list[tuple[float, float]]:
    """Per member: its baseline and the group's reward std (sample std, 0 for one member)."""
    n = len(rewards)
    if n == 0:
        return []
    total = math.fsum(rewards)
    mean = total / n
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / (n - 1)) if n > 1 else 0.0
    if leave_one_out and n > 1:
        return [((total - r) / (n - 1), std) for r in rewards]
    return [(mean, std)] * n


def _advantage(reward: float, baseline: float, std: float, normalize: bool, eps: float) -> float:
    centred = reward - baseline
    return centred / (std + eps) if normalize else centred


def _status(status: SessionStatus) -> str:
    if status == SessionStatus.COMPLETED:
        return COMPLETED
    if status == SessionStatus.TIMEOUT:
        return TIMEOUT
    return ERROR
