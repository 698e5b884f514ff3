"""The delivered fraction: every sampled token of a session is delivered or lost for a reason,
counted by the builder and settled by how the session ended.

Token ids: 99 ends a turn.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from polar.schemas.task import SessionFailure, SessionResult, SessionStatus
from polar.schemas.token_delivery import (
    MASK_REASONS,
    LossReason,
    LostTokens,
    TokenDelivery,
    settle,
)
from polar.schemas.trajectory import MaskReason
from polar.trajectory.per_request import PerRequestBuilder
from polar.trajectory.prefix_merging import PrefixMergingBuilder

from .sessions import record

EOT = 99
BUILDERS = [PrefixMergingBuilder, PerRequestBuilder]


def _trainable(trajectory) -> int:
    return sum(sum(t.loss_mask) for t in trajectory.traces if t.prompt_ids)


@pytest.mark.parametrize("builder", BUILDERS)
def test_every_sampled_token_is_delivered_or_lost_once(builder):
    r1 = record([1, 2], [10, 99], policy_version=3)
    r2 = record([1, 2, 10, 99, 5], [20, 21, 99], policy_version=4)
    r3 = record([1, 2, 10, 99, 5, 20, 21, 99, 6], [30, 99], policy_version=5)
    title = record([1, 3], [50, 51, 52, 99], tags=["side_call:title"])
    traj = builder({"eot_token_id": EOT, "max_staleness": 1}).build([r1, r2, title, r3])
    d = traj.stats.delivery
    assert d is not None
    assert d.sampled_tokens == 2 + 3 + 4 + 2
    assert d.lost == LostTokens(stale=2, side_call=4)
    assert d.delivered_tokens == 5 == _trainable(traj)
    assert d.fraction == pytest.approx(5 / 11)


def test_separate_side_calls_are_delivered_in_their_own_traces():
    title = record([1, 3], [50, 99], tags=["side_call:title"])
    traj = PerRequestBuilder({"side_calls": "separate"}).build([record([1], [10, 99]), title])
    assert traj.stats.delivery == TokenDelivery(sampled_tokens=4, delivered_tokens=4)


def test_an_aborted_trace_loses_all_its_calls_once_however_many_reasons():
    r1 = record([1, 2], [10, 99], policy_version=1)
    r2 = record([1, 2, 10, 99, 5], [20, 21], finish="abort", policy_version=2)
    traj = PrefixMergingBuilder({"eot_token_id": EOT, "max_staleness": 0}).build([r1, r2])
    d = traj.stats.delivery
    assert d is not None
    # r1 is stale and aborted-trace masked: counted once, under the first reason (aborted).
    assert d.lost == LostTokens(aborted=4) and d.delivered_tokens == 0


def test_a_call_without_prompt_ids_is_a_drift_break_loss():
    r1 = record([1, 2], [10, 99])
    r2 = record([], [20, 99])
    traj = PrefixMergingBuilder({"eot_token_id": EOT}).build([r1, r2])
    assert traj.stats.breaks == {"prompt_ids_missing": 1}
    assert traj.stats.delivery == TokenDelivery(
        sampled_tokens=4, delivered_tokens=2, lost=LostTokens(drift_break=2)
    )


def test_a_drift_break_in_exact_mode_keeps_the_call_trainable():
    r1 = record([1, 2], [10, 11, 99])
    r2 = record([1, 2, 10, 12, 99, 5], [20, 99])  # re-renders the reply differently
    traj = PrefixMergingBuilder({"eot_token_id": EOT}).build([r1, r2])
    assert traj.stats.breaks == {"context_drift": 1}
    d = traj.stats.delivery
    assert d is not None and d.delivered_tokens == d.sampled_tokens == 5


def test_no_calls_is_zero_tokens_not_unknown():
    traj = PerRequestBuilder().build([])
    assert traj.stats.delivery == TokenDelivery()


@pytest.mark.parametrize(
    ("status", "kind", "reason"),
    [
        (SessionStatus.TIMEOUT, "timeout", LossReason.TIMEOUT),
        (SessionStatus.ERROR, "evaluator", LossReason.EVALUATOR_FAILURE),
        (SessionStatus.ERROR, "agent", LossReason.AGENT_ERROR),
        (SessionStatus.ERROR, "infra", LossReason.INFRA_ERROR),
    ],
)
def test_the_sessions_outcome_settles_what_the_builder_delivered(status, kind, reason):
    calls = [
        record([1], [10, 99], policy_version=1),
        record([1, 10, 99, 5], [20, 99], policy_version=2),
    ]
    traj = PerRequestBuilder({"max_staleness": 0}).build(calls)
    result = SessionResult(
        session_id="s",
        task_id="t",
        status=status,
        trajectory=traj,
        failure=SessionFailure(kind=kind),
    )
    d = result.delivery
    assert d.delivered_tokens == 0 and d.sampled_tokens == 4
    assert d.lost == LostTokens(stale=2).adding(reason, 2)
    assert d.sessions == 1


def test_a_completed_session_keeps_the_builders_count_and_an_unbuilt_one_is_unknown():
    traj = PerRequestBuilder().build([record([1], [10, 99])])
    done = SessionResult(
        session_id="s", task_id="t", status=SessionStatus.COMPLETED, trajectory=traj
    )
    assert done.delivery == TokenDelivery(sampled_tokens=2, delivered_tokens=2, sessions=1)
    lost = SessionResult(session_id="s", task_id="t", status=SessionStatus.ERROR)
    assert lost.delivery == TokenDelivery(sessions=1, unknown_sessions=1)
    assert (
        "1 session(s) not counted" in TokenDelivery.total([done.delivery, lost.delivery]).describe()
    )


def test_every_mask_reason_has_a_loss_reason():
    assert {r.value for r in MaskReason} == {r.value for r in MASK_REASONS}


def test_counts_must_add_up():
    with pytest.raises(ValueError, match="not the 3 sampled"):
        TokenDelivery(sampled_tokens=3, delivered_tokens=1, lost=LostTokens(timeout=1))


@given(st.lists(st.tuples(st.integers(0, 50), st.sampled_from(list(LossReason))), max_size=8))
def test_totals_add_and_describe(parts):
    items = [
        settle(TokenDelivery(sampled_tokens=n, delivered_tokens=n), "COMPLETED", None).losing(r)
        if i % 2
        else TokenDelivery(sampled_tokens=n, delivered_tokens=n, sessions=1)
        for i, (n, r) in enumerate(parts)
    ]
    total = TokenDelivery.total(items)
    assert total.sampled_tokens == sum(n for n, _ in parts)
    assert total.delivered_tokens + total.lost.total == total.sampled_tokens
    assert total.sessions == len(parts)
    text = total.describe()
    assert ("delivered" in text) == bool(total.sampled_tokens)


def test_describe_names_the_reasons_most_first():
    d = TokenDelivery(
        sampled_tokens=1200, delivered_tokens=975, lost=LostTokens(timeout=180, side_call=45)
    )
    assert d.describe() == (
        "delivered 81.2% of 1,200 sampled tokens (lost: timeout 180, side call 45)"
    )
