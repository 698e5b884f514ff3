"""The session tree: lineage, retried attempts and staleness, under both builders.

Token ids: 99 ends a turn; [1, 7, 99] is the shared system prompt.
"""

from __future__ import annotations

import pytest

from polar.schemas.trajectory import MaskReason, TraceKind
from polar.trajectory.exporters.registry import create_exporter
from polar.trajectory.per_request import PerRequestBuilder
from polar.trajectory.prefix_merging import PrefixMergingBuilder

from .sessions import record

EOT = 99
SYSTEM = [1, 7, 99]


def scripted_session():
    """main turn 1, a sub-agent, main turn 2, a retried turn 3, then a compacted restart."""
    main1 = record([*SYSTEM, 2, 8, 99, 3], [10, 99], messages=[{"role": "user", "content": "fix"}])
    sub1 = record(
        [*SYSTEM, 2, 9, 99, 3],
        [40, 99],
        messages=[
            {"role": "system", "content": "You are an agent for Claude Code, Anthropic's CLI."},
            {"role": "user", "content": "find the bug"},
        ],
    )
    sub2 = record([*SYSTEM, 2, 9, 99, 3, 40, 99, 5], [41, 99])
    main2 = record([*SYSTEM, 2, 8, 99, 3, 10, 99, 6], [11, 99])
    lost = record([*SYSTEM, 2, 8, 99, 3, 10, 99, 6, 11, 99, 6], [12, 13, 99])  # abandoned
    retry = record([*SYSTEM, 2, 8, 99, 3, 10, 99, 6, 11, 99, 6], [14, 99])
    summary = "This session is being continued from a previous conversation. Summary: ..."
    compact = record(
        [*SYSTEM, 2, 77, 78, 99, 3],
        [15, 99],
        messages=[{"role": "user", "content": summary}],
    )
    after = record([*SYSTEM, 2, 77, 78, 99, 3, 15, 99, 6], [16, 99])
    return [main1, sub1, sub2, main2, lost, retry, compact, after]


def by_first_call(trajectory):
    return {t.metadata["completion_ids"][0]: t for t in trajectory.traces}


def test_prefix_merging_tree_has_lineage_and_masks_the_abandoned_attempt():
    calls = scripted_session()
    main1, sub1, _, _, lost, retry, compact, _ = calls
    traj = PrefixMergingBuilder({"eot_token_id": EOT}).build(calls)
    traces = by_first_call(traj)
    index = {t.metadata["completion_ids"][0]: i for i, t in enumerate(traj.traces)}
    root = traces[main1.completion_id]
    assert root.lineage.kind is TraceKind.MAIN and root.lineage.parent_call is None
    assert lost.completion_id in root.metadata["completion_ids"]
    sub = traces[sub1.completion_id].lineage
    assert (sub.kind, sub.reason) == (TraceKind.SUBAGENT, "claude_code_subagent_prompt")
    assert sub.parent_call == main1.completion_id
    assert sub.parent_trace == index[main1.completion_id]
    again = traces[retry.completion_id].lineage
    assert (again.kind, again.parent_call) == (TraceKind.RETRY, lost.completion_id)
    assert again.parent_trace == index[main1.completion_id]
    comp = traces[compact.completion_id].lineage
    assert (comp.kind, comp.reason) == (TraceKind.COMPACTION, "summary_marker")
    assert traces[compact.completion_id].metadata["num_calls"] == 2
    # the abandoned attempt stays in the data, masked, with its reason
    (span,) = root.masked
    assert (span.reason, span.completion_id) == (MaskReason.RETRY_ABANDONED, lost.completion_id)
    assert root.response_ids[span.start : span.end] == lost.sampled_ids
    assert root.loss_mask[span.start : span.end] == [0, 0, 0]
    assert sum(root.loss_mask) == 4  # main1's and main2's sampled ids
    assert traj.metadata["masked_tokens"] == {"retry_abandoned": 3}
    assert traj.metadata["trace_kinds"] == {
        "compaction": 1,
        "main": 1,
        "retry": 1,
        "subagent": 1,
    }


def test_per_request_gives_every_call_its_parent_and_the_same_kinds():
    calls = scripted_session()
    main1, sub1, sub2, main2, lost, retry, compact, after = calls
    traj = PerRequestBuilder().build(calls)
    traces = by_first_call(traj)
    expect = [
        (main1, TraceKind.MAIN, None),
        (sub1, TraceKind.SUBAGENT, main1),
        (sub2, TraceKind.SUBAGENT, sub1),
        (main2, TraceKind.MAIN, main1),
        (lost, TraceKind.MAIN, main2),
        (retry, TraceKind.RETRY, lost),
        (compact, TraceKind.COMPACTION, retry),  # equal shares: the latest call
        (after, TraceKind.COMPACTION, compact),
    ]
    for call, kind, parent in expect:
        lineage = traces[call.completion_id].lineage
        assert lineage.kind is kind, call.completion_id
        assert lineage.parent_call == (parent.completion_id if parent else None)
    assert traces[lost.completion_id].loss_mask == [0, 0, 0]
    assert traces[lost.completion_id].masked[0].reason is MaskReason.RETRY_ABANDONED
    assert traces[retry.completion_id].loss_mask == [1, 1]


def test_same_prompt_whose_first_attempt_continues_is_a_branch_and_stays_trainable():
    r1 = record([1, 2], [10, 99])
    r2 = record([1, 2, 10, 99, 5], [20, 99])
    r3 = record([1, 2, 10, 99, 5], [21, 99])
    r4 = record([1, 2, 10, 99, 5, 20, 99, 6], [30, 99])  # continues r2
    traj = PrefixMergingBuilder({"eot_token_id": EOT}).build([r1, r2, r3, r4])
    branch = by_first_call(traj)[r3.completion_id]
    assert branch.lineage.kind is TraceKind.BRANCH
    assert branch.lineage.parent_call == r2.completion_id
    assert all(not t.masked for t in traj.traces)


def test_history_rewrite_keeps_the_agents_kind_and_names_the_break():
    r1 = record([1, 2, 99, 3], [10, 99])
    r2 = record([1, 2, 99, 3, 10, 99, 5], [20, 99])
    r3 = record([1, 2, 99, 3, 10, 98, 5, 20, 99, 6], [30, 99])
    traj = PrefixMergingBuilder({"eot_token_id": EOT}).build([r1, r2, r3])
    second = by_first_call(traj)[r3.completion_id].lineage
    assert (second.kind, second.reason) == (TraceKind.MAIN, "prefix_break")
    assert second.parent_call == r2.completion_id


def across_two_updates():
    """One chain sampled at policy versions 3, 4, 5 (two weight updates mid-session)."""
    r1 = record([1, 2], [10, 99], policy_version=3)
    r2 = record([1, 2, 10, 99, 5], [20, 21, 99], policy_version=4)
    r3 = record([1, 2, 10, 99, 5, 20, 21, 99, 6], [30, 99], policy_version=5)
    return [r1, r2, r3]


@pytest.mark.parametrize("builder", [PrefixMergingBuilder, PerRequestBuilder])
def test_stale_turns_are_masked_not_dropped(builder):
    calls = across_two_updates()
    traj = builder({"eot_token_id": EOT, "max_staleness": 1}).build(
        calls, metadata={"policy_version": 5}
    )
    assert traj.metadata["policy_version"] == 5
    assert traj.metadata["calls_in_traces"] == 3
    stale = [s for t in traj.traces for s in t.masked]
    assert [(s.completion_id, s.reason) for s in stale] == [
        (calls[0].completion_id, MaskReason.STALE)
    ]
    assert traj.metadata["masked_tokens"] == {"stale": 2}
    trainable = [
        x for t in traj.traces for x, m in zip(t.response_ids, t.loss_mask, strict=True) if m
    ]
    assert trainable == [20, 21, 99, 30, 99]


def test_staleness_defaults_to_the_sessions_newest_version_and_is_off_unless_set():
    calls = across_two_updates()
    assert not any(t.masked for t in PerRequestBuilder().build(calls).traces)
    traj = PerRequestBuilder({"max_staleness": 0}).build(calls)
    assert traj.metadata["policy_version"] == 5
    assert traj.metadata["masked_tokens"] == {"stale": 5}


def test_staleness_is_never_measured_against_a_version_older_than_the_sessions_calls():
    """A trainer stamps its version on the task at submission (3 here); the session then ran
    across two updates (calls at 3, 4, 5): the first call is two versions behind, not zero."""
    calls = across_two_updates()
    traj = PrefixMergingBuilder({"eot_token_id": EOT, "max_staleness": 1}).build(
        calls, metadata={"policy_version": 3}
    )
    assert traj.metadata["policy_version"] == 5
    assert [(s.completion_id, s.reason) for t in traj.traces for s in t.masked] == [
        (calls[0].completion_id, MaskReason.STALE)
    ]
    ahead = PerRequestBuilder({"max_staleness": 1}).build(calls, metadata={"policy_version": 7})
    assert ahead.metadata["policy_version"] == 7  # a caller ahead of the calls is believed
    assert ahead.metadata["masked_tokens"] == {"stale": 7}  # every call is 2+ behind 7


@pytest.mark.parametrize("name", ["slime", "verl", "trl", "nemo_rl", "parquet", "sft", "jsonl"])
def test_exports_carry_lineage_and_mask_reasons(name, tmp_path):
    calls = scripted_session()
    traj = PrefixMergingBuilder({"eot_token_id": EOT}).build(calls)
    exporter = create_exporter(name)
    path = tmp_path / f"rows.{name}"
    exporter.write([traj], path)
    back = [exporter.trace(row) for row in exporter.read(path)]
    assert [t.lineage for t in back] == [t.lineage for t in traj.traces]
    assert [t.masked for t in back] == [t.masked for t in traj.traces]
    assert [t.loss_mask for t in back] == [t.loss_mask for t in traj.traces]


def test_block_index_finds_the_same_parent_as_comparing_every_earlier_prompt():
    """Random branching sessions with prompts spanning many 256-token blocks."""
    import random

    import numpy as np

    from polar.trajectory import lineage

    rng = random.Random(7)
    for _ in range(5):
        prompts: list[list[int]] = [[rng.randrange(3, 90) for _ in range(rng.randrange(1, 900))]]
        for _ in range(40):
            base = rng.choice(prompts)
            cut = rng.randrange(0, len(base) + 1)
            prompts.append(
                base[:cut] + [rng.randrange(3, 90) for _ in range(rng.randrange(0, 700))]
            )
        calls = [record(p, [rng.randrange(3, 90), EOT]) for p in prompts if p]
        arrays = [np.asarray(c.prompt_ids, dtype=np.int64) for c in calls]
        index = lineage._PrefixIndex()
        for i, q in enumerate(arrays):
            brute = max(
                ((lineage.common_prefix(arrays[j], q), j) for j in range(i)), default=(0, None)
            )
            parent, shared = lineage._parent(i, calls, arrays, index)
            assert shared == brute[0]
            if shared:
                assert lineage.common_prefix(arrays[parent], q) == shared
            index.add(i, q)


def test_the_trajectory_view_names_each_traces_kind_parent_and_masks(smollm2):
    from polar.trajectory.html import TokenText, trace_view

    calls = scripted_session()
    traj = PrefixMergingBuilder({"eot_token_id": EOT}).build(calls)
    views = {
        t.metadata["completion_ids"][0]: trace_view(t, i, TokenText(smollm2))
        for i, t in enumerate(traj.traces)
    }
    main1, sub1 = calls[0], calls[1]
    assert views[main1.completion_id].lineage == "main (first_call)"
    assert views[main1.completion_id].masked == "retry_abandoned 3"
    assert views[sub1.completion_id].lineage == "subagent of trace 0 (claude_code_subagent_prompt)"
    assert views[sub1.completion_id].masked is None


def test_codex_style_compaction_keeps_the_first_messages_and_appends_the_summary():
    """Codex rebuilds history as its first messages plus a summary: it shares the whole first
    prompt with the old conversation, yet is a compaction, not a rewrite of it."""
    first = [{"role": "user", "content": "fix the bug"}]
    old1 = record([1, 7, 99, 2, 8, 99, 3], [10, 99], messages=first)
    old2 = record([1, 7, 99, 2, 8, 99, 3, 10, 99, 5], [11, 99], messages=first)
    summary = "Another language model started to solve this problem and produced a summary of its thinking process. ..."
    new = record(
        [1, 7, 99, 2, 8, 99, 2, 66, 99, 3],
        [12, 99],
        messages=[*first, {"role": "user", "content": summary}],
    )
    later = record([1, 7, 99, 2, 8, 99, 2, 66, 99, 3, 12, 99, 5], [13, 99])
    traj = PrefixMergingBuilder({"eot_token_id": EOT}).build([old1, old2, new, later])
    traces = by_first_call(traj)
    lineage = traces[new.completion_id].lineage
    assert (lineage.kind, lineage.reason) == (TraceKind.COMPACTION, "summary_marker")
    assert lineage.parent_call == old2.completion_id
    assert traces[new.completion_id].metadata["completion_ids"] == [
        new.completion_id,
        later.completion_id,
    ]


def test_the_request_for_a_summary_is_not_itself_a_compaction():
    """Claude Code asks for the summary by extending the old conversation: same agent."""
    ask = "Your task is to create a detailed summary of the conversation so far."
    r1 = record([1, 7, 99, 2, 8, 99, 3], [10, 99])
    r2 = record(
        [1, 7, 99, 2, 8, 99, 3, 10, 99, 2, 9, 99, 3],
        [11, 99],
        messages=[{"role": "user", "content": "fix"}, {"role": "user", "content": ask}],
    )
    (trace,) = PrefixMergingBuilder({"eot_token_id": EOT}).build([r1, r2]).traces
    assert trace.lineage.kind is TraceKind.MAIN
