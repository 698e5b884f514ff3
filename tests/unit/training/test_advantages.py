"""GRPO advantages: group statistics, leave-one-out, per-trace rewards, failure policies."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.schemas.task import EvaluationSummary, SessionFailure, SessionResult, SessionStatus
from polar.schemas.trajectory import Trace, Trajectory, TrajectoryStatus
from polar.training.advantages import (
    SessionSample,
    compute_advantages,
    group_advantages,
    samples_from_results,
)
from polar.training.config import AdvantageConfig


def trace(n: int = 3, reward: float | None = None) -> Trace:
    return Trace(prompt_ids=[1, 2], response_ids=list(range(n)), loss_mask=[1] * n, reward=reward)


def session(
    sid: str, reward: float | None, *, group: str = "g", status: str = "COMPLETED", traces: int = 1
) -> SessionSample:
    return SessionSample(
        sid, group, status, reward, tuple(trace(reward=reward) for _ in range(traces))
    )


rewards_st = st.lists(
    st.floats(min_value=-10, max_value=10, allow_nan=False, allow_infinity=False),
    min_size=1,
    max_size=12,
)


def test_hand_computed_grpo_group() -> None:
    # rewards 1, 0, 0, 1: mean 0.5, sample std sqrt(1/3)
    got = group_advantages([1.0, 0.0, 0.0, 1.0], eps=0.0)
    std = math.sqrt(1 / 3)
    assert got == pytest.approx([0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std])


def test_without_std_normalisation_and_leave_one_out() -> None:
    assert group_advantages([1.0, 0.0, 0.0], std_normalize=False) == pytest.approx(
        [2 / 3, -1 / 3, -1 / 3]
    )
    # leave-one-out: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5
    assert group_advantages([1.0, 0.0, 0.0], std_normalize=False, leave_one_out=True) == (
        pytest.approx([1.0, -0.5, -0.5])
    )


def test_single_member_and_flat_groups_have_no_signal() -> None:
    assert group_advantages([0.7]) == [0.0]
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]


@settings(max_examples=200, deadline=None)
@given(rewards_st, st.booleans(), st.booleans())
def test_advantages_sum_to_zero_per_group(rewards: list[float], normalize: bool, loo: bool) -> None:
    adv = group_advantages(rewards, std_normalize=normalize, leave_one_out=loo)
    scale = max(1.0, max(abs(a) for a in adv))
    assert abs(math.fsum(adv)) <= 1e-6 * scale * len(adv)


@settings(max_examples=100, deadline=None)
@given(rewards_st)
def test_advantage_order_follows_reward_order(rewards: list[float]) -> None:
    adv = group_advantages(rewards)
    for i, (ri, ai) in enumerate(zip(rewards, adv, strict=True)):
        for rj, aj in zip(rewards[i + 1 :], adv[i + 1 :], strict=True):
            if ri > rj:
                assert ai >= aj


def test_multi_trace_session_shares_its_advantage_and_weighs_once_in_the_baseline() -> None:
    samples = [session("a", 1.0, traces=3), session("b", 0.0), session("c", 0.0)]
    scored, report = compute_advantages(samples, AdvantageConfig(std_normalize=False))
    by_session: dict[str, list[float]] = {}
    for s in scored:
        by_session.setdefault(s.session_id, []).append(s.advantage)
    # baseline is the mean over three sessions (1/3), not over five traces (3/5)
    assert by_session["a"] == pytest.approx([2 / 3] * 3)
    assert by_session["b"] == pytest.approx([-1 / 3])
    assert report.scored == 5 and report.groups == 1


def test_per_trace_rewards_are_measured_against_the_session_baseline() -> None:
    a = SessionSample("a", "g", "COMPLETED", 0.5, (trace(reward=1.0), trace(reward=0.0)))
    b = session("b", 0.5)
    c = session("c", 0.0)
    scored, _ = compute_advantages([a, b, c], AdvantageConfig(std_normalize=False))
    mean = (0.5 + 0.5 + 0.0) / 3
    assert [s.advantage for s in scored if s.session_id == "a"] == pytest.approx(
        [1.0 - mean, 0.0 - mean]
    )


def test_groups_are_independent() -> None:
    samples = [
        session("a", 1.0, group="x"),
        session("b", 0.0, group="x"),
        session("c", 5.0, group="y"),
        session("d", 5.0, group="y"),
    ]
    scored, report = compute_advantages(samples)
    adv = {s.session_id: s.advantage for s in scored}
    assert adv["a"] > 0 > adv["b"]
    assert adv["c"] == adv["d"] == 0.0
    assert report.groups == 2 and report.flat_groups == 1


@pytest.mark.parametrize(
    ("policy", "in_batch", "advantage_of_others"),
    [("drop", False, 0.5), ("zero_advantage", True, 0.5), ("penalize", True, 2 / 3)],
)
def test_failure_policies(policy: str, in_batch: bool, advantage_of_others: float) -> None:
    samples = [
        session("ok1", 1.0),
        session("ok2", 0.0),
        session("late", 1.0, status="TIMEOUT"),
    ]
    config = AdvantageConfig(std_normalize=False, on_timeout=policy)
    scored, report = compute_advantages(samples, config)
    adv = {s.session_id: s.advantage for s in scored}
    assert ("late" in adv) is in_batch
    assert adv["ok1"] == pytest.approx(advantage_of_others)
    if policy == "zero_advantage":
        assert adv["late"] == 0.0 and report.zeroed == {"timeout": 1}
    if policy == "penalize":
        assert adv["late"] == pytest.approx(-1 / 3) and report.penalized == {"timeout": 1}
    if policy == "drop":
        assert report.dropped == {"timeout": 1}


def test_completed_without_reward_follows_the_error_policy() -> None:
    samples = [
        session("a", 1.0),
        session("b", 0.0),
        session("c", None),
        session("d", 1.0, status="ERROR"),
    ]
    scored, report = compute_advantages(samples, AdvantageConfig(on_error="drop"))
    assert {s.session_id for s in scored} == {"a", "b"}
    assert report.dropped == {"error": 2}


def test_samples_from_results_reads_group_reward_and_status() -> None:
    traj = Trajectory(
        status=TrajectoryStatus.TIMEOUT,
        traces=[trace(reward=0.25), trace(reward=0.75)],
        metadata={"group_id": "grp"},
    )
    results = [
        SessionResult(session_id="s1", task_id="t", status=SessionStatus.TIMEOUT, trajectory=traj),
        SessionResult(
            session_id="s2",
            task_id="t",
            status=SessionStatus.COMPLETED,
            reward=1.0,
            evaluation=EvaluationSummary(verdict=True),
        ),
    ]
    s1, s2 = samples_from_results(results)
    assert (s1.group_id, s1.status, s1.reward, len(s1.traces)) == ("grp", "TIMEOUT", 0.5, 2)
    assert (s2.group_id, s2.status, s2.reward, s2.passed, s2.traces) == (
        "t",
        "COMPLETED",
        1.0,
        True,
        (),
    )


def test_infra_failures_leave_the_group_whatever_the_error_policy() -> None:
    """A node lost mid-session says nothing about the policy: it must not score 0 (penalize)
    nor sit in the group as a zero; with the switch off it follows on_error again."""
    infra = SessionSample("lost", "g", "ERROR", None, (trace(),), failure_kind="infra")
    agent = SessionSample("crashed", "g", "ERROR", None, (trace(),), failure_kind="agent")
    samples = [session("ok1", 1.0), session("ok2", 0.0), infra, agent]
    config = AdvantageConfig(std_normalize=False, on_error="penalize", failure_reward=0.0)
    scored, report = compute_advantages(samples, config)
    adv = {s.session_id: s.advantage for s in scored}
    assert "lost" not in adv and report.dropped == {"infra": 1}
    assert report.penalized == {"error": 1}  # the harness's own crash still scores 0
    assert adv["ok1"] == pytest.approx(1 - 1 / 3) and adv["crashed"] == pytest.approx(-1 / 3)

    kept = config.model_copy(update={"drop_infra_failures": False})
    scored, report = compute_advantages(samples, kept)
    assert "lost" in {s.session_id for s in scored} and report.penalized == {"error": 2}
    assert {s.session_id: s.advantage for s in scored}["ok1"] == pytest.approx(0.75)


def test_samples_from_results_carry_the_failure_kind() -> None:
    lost = SessionResult(
        session_id="s",
        task_id="t",
        status=SessionStatus.ERROR,
        failure=SessionFailure(kind="infra", reason="node_lost"),
    )
    ok = SessionResult(session_id="u", task_id="t", status=SessionStatus.COMPLETED, reward=1.0)
    assert [s.failure_kind for s in samples_from_results([lost, ok])] == ["infra", None]
