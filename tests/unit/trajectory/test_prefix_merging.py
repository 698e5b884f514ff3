"""prefix_merging, rule by rule, on hand-made token sequences (end-of-turn id 99)."""

from __future__ import annotations

from typing import Any

import pytest

from polar.errors import ConfigError
from polar.schemas.trajectory import TrajectoryStatus
from polar.trajectory.base import BuilderConfig
from polar.trajectory.prefix_merging import PrefixMergingBuilder
from polar.trajectory.registry import builders, create_builder

from .sessions import record

EOT = 99


def build(records, **config):
    return PrefixMergingBuilder({"eot_token_id": EOT, **config}).build(records)


def sampled_of(trace):
    return [t for t, m in zip(trace.response_ids, trace.loss_mask, strict=True) if m]


def test_worked_example_from_design():
    r1 = record([1, 2, 3], [10, 11, 99], logprobs=[-0.1, -0.2, -0.3])
    r2 = record([1, 2, 3, 10, 11, 99, 50, 51], [20, 21, 99], logprobs=[-0.4, -0.5, -0.6])
    traj = build([r1, r2])
    assert traj.status == TrajectoryStatus.COMPLETED
    (trace,) = traj.traces
    assert trace.prompt_ids == [1, 2, 3]
    assert trace.response_ids == [10, 11, 99, 50, 51, 20, 21, 99]
    assert trace.loss_mask == [1, 1, 1, 0, 0, 1, 1, 1]
    assert trace.response_logprobs == [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5, -0.6]
    assert trace.metadata["completion_ids"] == [r1.completion_id, r2.completion_id]
    assert trace.metadata["drift_turns"] == 0
    assert traj.metadata["completions_per_trace"] == 2.0


def test_end_of_turn_is_learned_from_first_natural_stop():
    r1 = record([1, 2], [10, 7], finish="length")  # its last token is not an end-of-turn
    r2 = record([1, 2, 10, 7, 99, 5], [20, 99])
    r3 = record([1, 2, 10, 7, 99, 5, 20, 99, 6], [30, 99])
    traj = PrefixMergingBuilder().build([r1, r2, r3])
    assert traj.metadata["eot_token_id"] == 99
    assert traj.metadata["eot_source"] == "learned"
    (trace,) = traj.traces
    assert trace.loss_mask == [1, 1, 0, 0, 1, 1, 0, 1, 1]


def test_length_stopped_turn_keeps_template_end_of_turn_masked():
    r1 = record([1, 2, 3], [10, 11], finish="length")
    r2 = record([1, 2, 3, 10, 11, 99, 50], [20, 99])
    (trace,) = build([r1, r2]).traces
    assert trace.response_ids == [10, 11, 99, 50, 20, 99]
    assert trace.loss_mask == [1, 1, 0, 0, 1, 1]
    assert trace.finish_reason == "stop"


def test_length_stop_with_drifted_rerendering_merges_when_tolerant_and_counts_drift():
    r1 = record([1, 2, 3], [10, 11, 12], finish="length")
    r2 = record([1, 2, 3, 10, 13, 99, 50], [20, 99])
    traj = build([r1, r2], context="tolerant")
    (trace,) = traj.traces
    assert trace.response_ids == [10, 11, 12, 99, 50, 20, 99]
    assert trace.loss_mask == [1, 1, 1, 0, 0, 1, 1]
    assert trace.metadata["drift_turns"] == 1
    assert trace.metadata["drift_tokens"] == 2  # [11, 12] vs [13]
    assert traj.metadata["drift_tokens"] == 2


def test_drift_is_counted_per_turn_and_trajectory():
    r1 = record([1, 2], [10, 11, 12, 99])
    r2 = record([1, 2, 10, 77, 12, 99, 5], [20, 99])  # one token re-rendered differently
    r3 = record([1, 2, 10, 77, 12, 99, 5, 20, 99, 6], [30, 99])  # exact
    traj = build([r1, r2, r3], context="tolerant")
    (trace,) = traj.traces
    assert trace.metadata["inexact_context_calls"] == [r2.completion_id, r3.completion_id]
    assert traj.metadata["merged_calls"] == 2
    assert traj.metadata["context_exact_calls"] == 0
    assert sampled_of(trace) == [10, 11, 12, 99, 20, 99, 30, 99]
    assert trace.metadata["drift_turns"] == 1
    assert trace.metadata["drift_tokens"] == 1
    assert trace.response_ids == [10, 11, 12, 99, 5, 20, 99, 6, 30, 99]


def test_drift_splits_the_trace_by_default_so_every_context_is_exact():
    r1 = record([1, 2], [10, 11, 12, 99])
    r2 = record([1, 2, 10, 77, 12, 99, 5], [20, 99])  # the engine saw 77, not the sampled 11
    r3 = record([1, 2, 10, 77, 12, 99, 5, 20, 99, 6], [30, 99])  # extends r2 exactly
    traj = build([r1, r2, r3])
    first, second = traj.traces
    assert first.metadata["completion_ids"] == [r1.completion_id]
    assert second.metadata["completion_ids"] == [r2.completion_id, r3.completion_id]
    assert second.metadata["break_reason"] == "context_drift"
    assert second.prompt_ids == r2.prompt_ids
    assert second.prompt_ids + second.response_ids == r3.prompt_ids + r3.sampled_ids
    assert traj.metadata["breaks"] == {"context_drift": 1}
    assert traj.metadata["drift_turns"] == 1 and traj.metadata["drift_tokens"] == 1
    assert traj.metadata["merged_calls"] == traj.metadata["context_exact_calls"] == 1


def test_length_stop_drift_splits_by_default():
    r1 = record([1, 2, 3], [10, 11, 12], finish="length")
    r2 = record([1, 2, 3, 10, 13, 99, 50], [20, 99])
    traj = build([r1, r2])
    assert [t.metadata["num_calls"] for t in traj.traces] == [1, 1]
    assert traj.traces[1].metadata["break_reason"] == "context_drift"


def test_template_repair_needs_tolerant_context():
    with pytest.raises(ConfigError, match="tolerant"):
        create_builder("prefix_merging", {"template_repair": ["qwen3_empty_think"]})


def test_longest_matching_chain_wins():
    a = record([1, 2], [10, 99])
    b = record([1, 2, 10, 99, 5], [20, 99])
    # extends both a's prompt and b's prompt; b's is longer
    c = record([1, 2, 10, 99, 5, 20, 99, 6], [30, 99])
    (trace,) = build([a, b, c]).traces
    assert trace.metadata["num_calls"] == 3


def test_interleaved_parallel_chains_stay_separate():
    a1 = record([1, 2], [10, 99])
    b1 = record([3, 4], [40, 99])
    a2 = record([1, 2, 10, 99, 5], [11, 99])
    b2 = record([3, 4, 40, 99, 6], [41, 99])
    a3 = record([1, 2, 10, 99, 5, 11, 99, 5], [12, 99])
    traj = build([a1, b1, a2, b2, a3])
    assert [t.metadata["completion_ids"] for t in traj.traces] == [
        [a1.completion_id, a2.completion_id, a3.completion_id],
        [b1.completion_id, b2.completion_id],
    ]
    assert [t.metadata["chain_index"] for t in traj.traces] == [0, 1]
    assert traj.metadata["breaks"] == {}


def test_subagent_sharing_only_the_system_prompt_is_its_own_chain():
    main1 = record([1, 7, 99, 2, 8, 99, 3], [10, 99])
    sub1 = record([1, 7, 99, 2, 9, 99, 3], [40, 99])  # same system, different task
    main2 = record([1, 7, 99, 2, 8, 99, 3, 10, 99, 5], [11, 99])
    traj = build([main1, sub1, main2])
    assert len(traj.traces) == 2
    assert {t.metadata["break_reason"] for t in traj.traces} == {None}
    assert {t.metadata["forked_from"] for t in traj.traces} == {None}


def test_retry_with_identical_prompt_continues_with_the_reply_the_harness_used():
    r1 = record([1, 2], [10, 99])
    r2 = record([1, 2, 10, 99, 5], [20, 99])  # reply discarded by the harness
    r3 = record([1, 2, 10, 99, 5], [21, 99])  # retry, same prompt
    r4 = record([1, 2, 10, 99, 5, 21, 99, 6], [30, 99])
    traj = build([r1, r2, r3, r4])
    ids = [t.metadata["completion_ids"] for t in traj.traces]
    assert ids == [[r1.completion_id, r2.completion_id], [r3.completion_id, r4.completion_id]]
    second = traj.traces[1]
    assert second.metadata["break_reason"] == "retry"
    assert second.metadata["chain_index"] == 0 and second.metadata["segment_index"] == 1
    assert second.prompt_ids == r3.prompt_ids
    assert second.metadata["drift_turns"] == 0
    assert traj.metadata["breaks"] == {"retry": 1}


def test_retry_whose_original_continues_is_a_parallel_branch():
    r1 = record([1, 2], [10, 99])
    r2 = record([1, 2, 10, 99, 5], [20, 99])
    r3 = record([1, 2, 10, 99, 5], [21, 99])
    r4 = record([1, 2, 10, 99, 5, 20, 99, 6], [30, 99])  # continues the first reply
    traj = build([r1, r2, r3, r4])
    chains = {t.metadata["chain_index"]: t.metadata for t in traj.traces}
    assert chains[0]["completion_ids"] == [r1.completion_id, r2.completion_id, r4.completion_id]
    assert chains[1]["completion_ids"] == [r3.completion_id]
    assert chains[1]["forked_from"] == r2.completion_id
    assert chains[1]["break_reason"] is None


def test_prefix_break_mid_chain_continues_in_a_new_segment():
    r1 = record([1, 2, 99, 3], [10, 99])
    r2 = record([1, 2, 99, 3, 10, 99, 5], [20, 99])
    # history rewritten after the first turn (e.g. a template that drops past reasoning)
    r3 = record([1, 2, 99, 3, 10, 98, 5, 20, 99, 6], [30, 99])
    r4 = record([1, 2, 99, 3, 10, 98, 5, 20, 99, 6, 30, 99, 7], [40, 99])
    traj = build([r1, r2, r3, r4])
    assert [t.metadata["completion_ids"] for t in traj.traces] == [
        [r1.completion_id, r2.completion_id],
        [r3.completion_id, r4.completion_id],
    ]
    first, second = traj.traces
    assert second.metadata["break_reason"] == "prefix_break"
    assert (second.metadata["chain_index"], second.metadata["segment_index"]) == (0, 1)
    assert second.prompt_ids == r3.prompt_ids
    assert sampled_of(first) + sampled_of(second) == [10, 99, 20, 99, 30, 99, 40, 99]
    assert traj.metadata["breaks"] == {"prefix_break": 1}
    assert traj.metadata["num_chains"] == 1


def test_missing_end_of_turn_breaks_instead_of_dropping():
    r1 = record([1, 2], [10, 11], finish="length")
    r2 = record([1, 2, 10, 12, 5], [20, 21], finish="length")  # drifted, no end-of-turn anywhere
    traj = PrefixMergingBuilder().build([r1, r2])  # nothing stopped naturally: none learned
    assert traj.metadata["eot_token_id"] is None
    assert [t.metadata["break_reason"] for t in traj.traces] == [None, "no_end_of_turn"]
    assert traj.traces[1].prompt_ids == r2.prompt_ids
    assert traj.metadata["calls_in_traces"] == 2


def test_turn_missing_from_next_prompt_is_a_split_failure():
    # the template dropped the previous (tool-call) turn's content entirely
    r1 = record([1, 2], [10, 11, 99], finish="tool_calls")
    r2 = record([1, 2, 99, 5], [20, 99])
    traj = build([r1, r2])
    assert [t.metadata["break_reason"] for t in traj.traces] == [None, "split_failure"]
    assert traj.metadata["breaks"] == {"split_failure": 1}


def test_call_without_prompt_ids_is_kept_and_reported():
    r1 = record([1, 2], [10, 99])
    r2 = record([], [20, 99])
    r3 = record([1, 2, 10, 99, 5], [30, 99])
    traj = build([r1, r2, r3])
    assert len(traj.traces) == 2
    lone = next(t for t in traj.traces if t.metadata["completion_ids"] == [r2.completion_id])
    assert lone.metadata["break_reason"] == "prompt_ids_missing"
    assert lone.prompt_ids == [] and lone.response_ids == [20, 99]


def test_logprobs_null_when_any_call_lacks_them():
    r1 = record([1, 2], [10, 99])
    r2 = record([1, 2, 10, 99, 5], [20, 99], logprobs=None)
    (trace,) = build([r1, r2]).traces
    assert trace.response_logprobs is None
    assert trace.loss_mask == [1, 1, 0, 1, 1]


def test_misaligned_logprobs_also_null():
    r1 = record([1, 2], [10, 99], logprobs=[-0.5])
    (trace,) = build([r1]).traces
    assert trace.response_logprobs is None


def test_zero_calls_is_an_error_with_a_clear_message():
    traj = build([])
    assert traj.status == TrajectoryStatus.ERROR
    assert traj.traces == []
    assert "no model calls" in (traj.error or "")


def test_timeout_status_is_kept_for_partial_sessions():
    builder = PrefixMergingBuilder({"eot_token_id": EOT})
    traj = builder.build([record([1, 2], [10, 99])], status=TrajectoryStatus.TIMEOUT)
    assert traj.status == TrajectoryStatus.TIMEOUT
    assert len(traj.traces) == 1


def test_side_calls_excluded_by_default_and_listed():
    r1 = record([1, 2], [10, 99])
    title = record([8, 9], [50, 99], tags=["side_call:title"])
    r2 = record([1, 2, 10, 99, 5], [20, 99])
    traj = build([r1, title, r2])
    assert len(traj.traces) == 1
    assert traj.metadata["excluded_side_calls"] == [title.completion_id]
    assert traj.metadata["num_calls"] == 3


def test_side_calls_kept_as_separate_traces():
    r1 = record([1, 2], [10, 99])
    memory = record([1, 2, 10, 99, 5], [60, 99], tags=["side_call:memory"])
    r2 = record([1, 2, 10, 99, 5], [20, 99])
    r3 = record([1, 2, 10, 99, 5, 20, 99, 6], [30, 99])
    traj = build([r1, memory, r2, r3], side_calls="separate")
    assert len(traj.traces) == 2
    agent, side = traj.traces
    assert agent.metadata["num_calls"] == 3 and agent.metadata["side_call"] is None
    assert side.metadata["side_call"] == "memory"
    assert side.metadata["completion_ids"] == [memory.completion_id]
    assert side.metadata["chain_index"] == 1
    assert traj.metadata["excluded_side_calls"] == []
    assert traj.metadata["side_call_traces"] == 1


def test_only_side_calls_is_an_error_when_excluded():
    traj = build([record([1], [2, 99], tags=["side_call:title"])])
    assert traj.status == TrajectoryStatus.ERROR
    assert "side calls" in (traj.error or "")


def test_aborted_generation_is_marked_and_untrainable_by_default():
    r1 = record([1, 2], [10, 11], finish="abort", flags=["aborted"])
    r2 = record([1, 2, 10, 11, 99, 5], [20, 99])
    (trace,) = build([r1, r2]).traces
    assert trace.metadata["aborted"] is True
    assert trace.metadata["trainable"] is False
    assert trace.metadata["untrainable_reasons"] == ["aborted"]
    assert set(trace.loss_mask) == {0}
    (kept,) = build([r1, r2], aborted_trainable=True).traces
    assert kept.metadata["trainable"] is True
    assert kept.loss_mask == [1, 1, 0, 0, 1, 1]


def test_multiple_policy_versions_marked_and_configurable():
    r1 = record([1, 2], [10, 99], policy_version=3)
    r2 = record([1, 2, 10, 99, 5], [20, 99], policy_version=4)
    (trace,) = build([r1, r2]).traces
    assert trace.metadata["policy_versions"] == [3, 4]
    assert trace.metadata["trainable"] is True
    (strict,) = build([r1, r2], multi_version_trainable=False).traces
    assert strict.metadata["untrainable_reasons"] == ["multiple_policy_versions"]
    assert set(strict.loss_mask) == {0}


def test_response_messages_are_replies_and_inserted_messages():
    m1: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    reply1: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}
    m2 = [*m1, reply1, {"role": "tool", "tool_call_id": "c", "content": "ok"}]
    reply2 = {"role": "assistant", "content": "done"}
    r1 = record([1, 2], [10, 99], messages=m1, response=reply1)
    r2 = record([1, 2, 10, 99, 5], [20, 99], messages=m2, response=reply2)
    (trace,) = build([r1, r2]).traces
    assert trace.prompt_messages == m1
    assert trace.response_messages == [reply1, m2[2], reply2]


def test_calls_are_ordered_by_sequence_not_input_order():
    r1 = record([1, 2], [10, 99], seq=1)
    r2 = record([1, 2, 10, 99, 5], [20, 99], seq=2)
    (trace,) = build([r2, r1]).traces
    assert trace.metadata["completion_ids"] == [r1.completion_id, r2.completion_id]


def test_registry_by_name_and_import_path():
    assert {"per_request", "prefix_merging"} <= set(builders.names())
    by_path = create_builder("polar.trajectory.prefix_merging:PrefixMergingBuilder")
    assert isinstance(by_path, PrefixMergingBuilder)
    with pytest.raises(ConfigError):
        create_builder("no_such_builder")


def test_config_is_strict():
    with pytest.raises(ConfigError):
        create_builder("prefix_merging", {"eot_token": 2})
    with pytest.raises(ConfigError, match="no_such_rule"):
        create_builder("prefix_merging", {"template_repair": ["no_such_rule"]})
    with pytest.raises(ValueError, match="no_such_rule"):
        BuilderConfig(template_repair=["no_such_rule"])


def test_call_spans_locate_each_calls_sampled_ids_and_context_in_the_trace():
    r1 = record([1, 2, 3], [10, 11, 99])
    r2 = record([1, 2, 3, 10, 11, 99, 50, 51], [20, 21, 99])
    r3 = record([1, 2, 3, 10, 11, 99, 50, 51, 20, 21, 99, 60], [30, 99])
    (trace,) = build([r1, r2, r3]).traces
    spans = trace.metadata["call_spans"]
    assert spans == [[0, 3], [5, 8], [9, 11]]
    assert [trace.response_ids[s:e] for s, e in spans] == [r.sampled_ids for r in (r1, r2, r3)]
    for (start, _), rec in zip(spans, (r1, r2, r3), strict=True):
        assert trace.prompt_ids + trace.response_ids[:start] == rec.prompt_ids
