"""The trainer's per-step staleness report over a session that ran across two weight updates."""

from __future__ import annotations

from polar.training.metrics import staleness
from polar.trajectory.prefix_merging import PrefixMergingBuilder

from ..trajectory.test_session_tree import across_two_updates as session


def test_step_reports_masked_stale_turns_and_version_lag():
    builder = PrefixMergingBuilder({"eot_token_id": 99, "max_staleness": 1})
    (trace,) = builder.build(session(), metadata={"policy_version": 5}).traces
    assert trace.loss_mask == [0, 0, 0, 1, 1, 1, 0, 1, 1]  # version 3 and the glue masked
    report = staleness([trace], policy_version=5)
    assert report == {
        "stale_turns": 1,
        "stale_tokens": 2,
        "version_lag_max": 2,
        "version_lag_mean": 1.0,
        "masked_at_consumption_turns": 0,
        "masked_at_consumption_tokens": 0,
    }


def test_nothing_stale_without_the_rule_but_the_lag_is_still_reported():
    (trace,) = PrefixMergingBuilder({"eot_token_id": 99}).build(session()).traces
    report = staleness([trace], policy_version=6)
    assert (report["stale_turns"], report["version_lag_max"]) == (0, 3)
    assert report["version_lag_mean"] == 2.0
