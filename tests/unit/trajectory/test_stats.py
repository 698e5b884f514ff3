"""The builders write their facts as TraceStats / TrajectoryStats: every key they write is a
field, the exported JSON is the dicts they wrote before, and an unknown name is refused."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from pydantic import ValidationError

from polar.capture import routed_experts
from polar.schemas.trajectory import Trace, TraceStats, Trajectory, TrajectoryStats
from polar.trajectory.exporters.registry import create_exporter
from polar.trajectory.per_request import PerRequestBuilder
from polar.trajectory.prefix_merging import PrefixMergingBuilder

from .sessions import EOT, record

NODE_FACTS = {
    "session_id": "s1",
    "task_id": "t1",
    "sample_index": 0,
    "node_id": "n1",
    "harness": "codex",
    "group_id": "g1",
    "policy_version": 1,
}


def _session() -> list:
    """Two agent calls that merge exactly, and a side call (excluded by default)."""
    first = record([1, 10, 11], [20, EOT], completion_id="a", seq=0, policy_version=1)
    second = record([1, 10, 11, 20, EOT, 12], [21, EOT], completion_id="b", seq=1, policy_version=1)
    title = record([1, 30], [31, EOT], completion_id="t", seq=2, tags=["side_call:title"])
    return [first, second, title]


def _exported(trajectory: Trajectory) -> dict:
    return orjson.loads(trajectory.model_dump_json())


def test_a_built_trajectory_exports_every_fact_the_builder_wrote() -> None:
    built = PrefixMergingBuilder().build(_session(), metadata=NODE_FACTS)
    exported = _exported(built)
    assert exported["metadata"] == {
        "builder": "prefix_merging",
        **NODE_FACTS,
        "eot_token_id": EOT,
        "eot_source": "learned",
        "template_repair": [],
        "num_traces": 1,
        "num_chains": 1,
        "breaks": {},
        "drift_turns": 0,
        "drift_tokens": 0,
        "repaired_steps": 0,
        "repaired_tokens": 0,
        "side_call_traces": 0,
        "completions_per_trace": 2.0,
        "merged_calls": 1,
        "context_exact_calls": 1,
        "untrainable_traces": 0,
        "masked_tokens": {},
        "trace_kinds": {"main": 1},
        "num_calls": 3,
        "calls_in_traces": 2,
        "excluded_side_calls": ["t"],
        "delivery": {
            "sampled_tokens": 6,
            "delivered_tokens": 4,
            "lost": {
                "stale": 0,
                "retry_abandoned": 0,
                "multiple_policy_versions": 0,
                "aborted": 0,
                "drift_break": 0,
                "side_call": 2,
                "timeout": 0,
                "evaluator_failure": 0,
                "agent_error": 0,
                "infra_error": 0,
            },
            "sessions": 0,
            "unknown_sessions": 0,
        },
    }
    (trace,) = exported["traces"]
    assert trace["response_ids"] == [20, EOT, 12, 21, EOT]
    assert trace["metadata"] == {
        "completion_ids": ["a", "b"],
        "num_calls": 2,
        "merged_calls": 1,
        "context_exact_calls": 1,
        "inexact_context_calls": [],
        "chain_index": 0,
        "segment_index": 0,
        "break_reason": None,
        "forked_from": None,
        "side_call": None,
        "drift_turns": 0,
        "drift_tokens": 0,
        "repaired_steps": 0,
        "repaired_tokens": 0,
        "policy_versions": [1],
        "aborted": False,
        "trainable": True,
        "untrainable_reasons": [],
        "sampled_tokens": 4,
        "flags": [],
        "call_spans": [[0, 2], [3, 5]],
        "call_versions": [1, 1],
    }  # no routed_experts: absent, not null, when the calls carry none
    (row,) = create_exporter("jsonl").rows([built])
    assert row["metadata"] == trace["metadata"]
    # Every key written is a typed fact, read back as written.
    assert set(exported["metadata"]) <= set(TrajectoryStats.model_fields)
    assert built.stats.written() == exported["metadata"]
    assert built.traces[0].stats.written() == trace["metadata"]


def test_facts_a_builder_does_not_write_stay_absent() -> None:
    """per_request states no end of turn; no calls: only the counts that say so."""
    calls = _session()
    routing = routed_experts.encode(np.zeros((len(calls[0].prompt_ids) + 1, 1, 2), dtype=int))
    calls[0] = calls[0].model_copy(update={"routed_experts": routing})
    built = PerRequestBuilder({"side_calls": "separate"}).build(calls)
    meta = _exported(built)["metadata"]
    assert not {"eot_token_id", "eot_source", "template_repair", "session_id"} & set(meta)
    assert (meta["builder"], meta["num_traces"], meta["side_call_traces"]) == (
        "per_request",
        3,
        1,
    )
    assert meta["policy_version"] == 1  # none given: the session's newest
    routed, plain, side = (t.metadata for t in built.traces)
    assert routed["routed_experts"] == routing and routed["call_spans"] == [[0, 2]]
    assert "routed_experts" not in plain and side["side_call"] == "title"
    empty = PerRequestBuilder().build([], metadata={"session_id": "s1"})
    assert set(_exported(empty)["metadata"]) == {
        "builder",
        "session_id",
        "num_calls",
        "num_traces",
        "delivery",
    }


def test_an_unknown_fact_is_refused_where_it_is_written() -> None:
    with pytest.raises(ValidationError, match="num_calz"):
        TraceStats(num_calz=2)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="extra_forbidden"):
        TrajectoryStats.model_validate({"num_calls": 1, "typo_key": 1})
    with pytest.raises(ValidationError, match="sesion_id"):
        PrefixMergingBuilder().build(_session(), metadata={"sesion_id": "s1"})
    with pytest.raises(ValidationError, match="num_calls"):
        TraceStats(num_calls="many")  # type: ignore[arg-type]


def test_reading_is_tolerant_and_stating_keeps_other_keys() -> None:
    """Stored results and user traces may carry keys of their own: read without them, and
    kept as they were when a fact is stated over them."""
    trace = Trace(
        prompt_ids=[1],
        response_ids=[2],
        loss_mask=[1],
        metadata={"num_calls": 1, "mine": {"x": 1}},
    )
    assert trace.stats == TraceStats(num_calls=1)
    untrained = trace.with_stats(TraceStats(trainable=False))
    assert untrained.metadata == {"num_calls": 1, "mine": {"x": 1}, "trainable": False}
    assert trace.metadata == {"num_calls": 1, "mine": {"x": 1}}  # a copy
    trajectory = Trajectory(status="COMPLETED", metadata={"note": "n", "num_calls": 2})
    stated = trajectory.with_stats(TrajectoryStats(turn_rewards=3))
    assert stated.metadata == {"note": "n", "num_calls": 2, "turn_rewards": 3}
    assert stated.stats.turn_rewards == 3 and stated.stats.num_calls == 2


def test_a_callers_version_that_is_no_int_is_ignored_as_before() -> None:
    """The caller's policy_version only says where staleness is measured from: a task's
    metadata may carry anything there, and the build states the version it measured against."""
    built = PerRequestBuilder().build(_session(), metadata={"policy_version": "v3"})
    assert built.metadata["policy_version"] == built.stats.policy_version == 1
    empty = PerRequestBuilder().build([], metadata={"policy_version": "v3"})
    assert empty.metadata["policy_version"] is None
    assert "policy_version" not in PerRequestBuilder().build([]).metadata
