"""The session tree from the CLIs' own agent ids (lineage headers), prefixes as cross-check.

Token ids: 99 ends a turn; [1, 7, 99] is the shared system prompt. Header sets are those of
tests/unit/capture/test_harness_ids.py.
"""

from __future__ import annotations

import json
from typing import Any

from polar.capture.harness_ids import harness_ids
from polar.capture.records import CaptureRecord
from polar.schemas.trajectory import TraceKind
from polar.trajectory.prefix_merging import PrefixMergingBuilder

from ..capture.test_harness_ids import (
    CLAUDE_MAIN,
    CLAUDE_SUB,
    CODEX_REVIEW,
    CODEX_ROOT,
    OPENCODE_CHILD,
    OPENCODE_MAIN,
)
from .sessions import record

EOT = 99
SYSTEM = [1, 7, 99]


def sent(headers: dict[str, str], prompt: list[int], sampled: list[int]) -> CaptureRecord:
    return record(prompt, sampled).model_copy(update={"harness_ids": harness_ids(headers)})


def build(calls: list[CaptureRecord]) -> dict[str, Any]:
    traj = PrefixMergingBuilder({"eot_token_id": EOT}).build(calls)
    return {t.metadata["completion_ids"][0]: t for t in traj.traces}


def spawn_session(main: dict[str, str], sub: dict[str, str]) -> list[CaptureRecord]:
    """main turn 1, a sub-agent's two turns (sharing only the system prompt), main turn 2."""
    return [
        sent(main, [*SYSTEM, 2, 8, 99, 3], [10, 99]),
        sent(sub, [*SYSTEM, 2, 9, 99, 3], [40, 99]),
        sent(sub, [*SYSTEM, 2, 9, 99, 3, 40, 99, 5], [41, 99]),
        sent(main, [*SYSTEM, 2, 8, 99, 3, 10, 99, 6], [11, 99]),
    ]


def test_each_clis_sub_agent_comes_from_its_ids_and_agrees_with_its_prefixes() -> None:
    for main, sub in (
        (CLAUDE_MAIN, CLAUDE_SUB),
        (CODEX_ROOT, CODEX_REVIEW),
        (OPENCODE_MAIN, OPENCODE_CHILD),
    ):
        main1, sub1, sub2, main2 = calls = spawn_session(main, sub)
        traces = build(calls)
        root, branch = traces[main1.completion_id], traces[sub1.completion_id]
        assert root.metadata["completion_ids"] == [main1.completion_id, main2.completion_id]
        assert root.lineage.kind is TraceKind.MAIN
        assert root.lineage.harness == main1.harness_ids
        assert branch.metadata["completion_ids"] == [sub1.completion_id, sub2.completion_id]
        assert branch.lineage.kind is TraceKind.SUBAGENT
        assert branch.lineage.parent_call == main1.completion_id
        assert branch.lineage.reason == "shares_only_system_prefix"  # the prefix's, agreed
        assert branch.lineage.harness == sub1.harness_ids
        assert branch.lineage.harness.parent == main1.harness_ids.agent
        assert root.lineage.disagreements == branch.lineage.disagreements == []
    assert build(calls)[calls[1].completion_id].lineage.harness.cli == "opencode"


def test_a_sub_agents_parent_call_is_its_spawners_latest_by_the_ids() -> None:
    """A sub-agent spawned from main's second turn: the ids name main as its parent, so its
    parent call is main's latest call before it, whichever earlier prompt it shares most."""
    main1 = sent(CODEX_ROOT, [*SYSTEM, 2, 8, 99, 3], [10, 99])
    main2 = sent(CODEX_ROOT, [*SYSTEM, 2, 8, 99, 3, 10, 99, 6], [11, 99])
    review = sent(CODEX_REVIEW, [*SYSTEM, 4, 99, 3], [50, 99])
    branch = build([main1, main2, review])[review.completion_id]
    assert (branch.lineage.kind, branch.lineage.parent_call) == (
        TraceKind.SUBAGENT,
        main2.completion_id,
    )
    assert branch.lineage.harness.subagent == "review"


def test_a_disagreement_is_decided_by_the_ids_and_reported_on_the_trace() -> None:
    """The sub-agent's first prompt extends main's (prefix inference: the same agent goes on),
    yet its headers name a new agent spawned by main: the ids decide, and both traces say so."""
    main1 = sent(CLAUDE_MAIN, [*SYSTEM, 2, 8, 99, 3], [10, 99])
    sub1 = sent(CLAUDE_SUB, [*SYSTEM, 2, 8, 99, 3, 10, 99, 6], [40, 99])
    traces = build([main1, sub1])
    # prefix merging still merges the extension into one trace; the tree reports the clash
    (trace,) = traces.values()
    (clash,) = trace.lineage.disagreements
    assert clash.completion_id == sub1.completion_id
    assert (clash.by_headers, clash.headers_parent_call) == ("new_agent", main1.completion_id)
    assert (clash.by_prefix, clash.prefix_parent_call) == ("continues", main1.completion_id)


def test_a_new_agent_by_prefix_but_the_same_agent_by_the_ids_stays_that_agents() -> None:
    """A turn whose history was rewritten from the start (it shares only the system prompt):
    by prefix a new sub-agent, by its thread id the root going on."""
    main1 = sent(CODEX_ROOT, [*SYSTEM, 2, 8, 99, 3], [10, 99])
    rewritten = sent(CODEX_ROOT, [*SYSTEM, 2, 5, 99, 3], [12, 99])
    trace = build([main1, rewritten])[rewritten.completion_id]
    assert (trace.lineage.kind, trace.lineage.reason) == (TraceKind.MAIN, "harness_headers")
    assert trace.lineage.parent_call == main1.completion_id
    (clash,) = trace.lineage.disagreements
    assert (clash.by_headers, clash.by_prefix) == ("rewrites", "new_agent")


def test_calls_without_ids_keep_the_prefix_tree() -> None:
    main1 = sent(CLAUDE_MAIN, [*SYSTEM, 2, 8, 99, 3], [10, 99])
    sub1 = record([*SYSTEM, 2, 9, 99, 3], [40, 99])  # no headers: a proxy stripped them
    branch = build([main1, sub1])[sub1.completion_id]
    assert (branch.lineage.kind, branch.lineage.harness) == (TraceKind.SUBAGENT, None)
    assert branch.lineage.disagreements == []


def test_a_sub_agent_whose_spawner_made_no_call_agrees_with_the_first_call() -> None:
    """``codex exec review``: the root thread only starts the review, so the review sub-agent's
    first call is the session's first. The ids (a sub-agent of a thread with no call here)
    and the prefixes (the first call) agree: a subagent trace with no parent call, no
    disagreement reported."""
    calls = [
        sent(CODEX_REVIEW, [*SYSTEM, 4, 99, 3], [50, 99]),
        sent(CODEX_REVIEW, [*SYSTEM, 4, 99, 3, 50, 99, 5], [51, 99]),
    ]
    (review,) = build(calls).values()
    assert review.metadata["completion_ids"] == [c.completion_id for c in calls]
    assert (review.lineage.kind, review.lineage.parent_call) == (TraceKind.SUBAGENT, None)
    assert review.lineage.harness == calls[0].harness_ids
    assert review.lineage.disagreements == []


def test_a_background_sub_agents_parent_is_the_call_that_spawned_it() -> None:
    """Claude Code 2.1.332 runs an Agent sub-agent in the background: the main agent's next
    call (after "agent launched") comes before the sub-agent's first. The sub-agent's parent
    call is the one whose tool call carries its prompt, not the main agent's latest call."""
    prompt = "List the files in the current directory and report them."
    spawn = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "Agent", "arguments": json.dumps({"prompt": prompt})},
            }
        ],
    }
    user = [{"role": "user", "content": "Create proof.txt"}]
    main1 = record([*SYSTEM, 2, 8, 99, 3], [10, 99], messages=user, response=spawn)
    main1 = main1.model_copy(update={"harness_ids": harness_ids(CLAUDE_MAIN)})
    main2 = sent(CLAUDE_MAIN, [*SYSTEM, 2, 8, 99, 3, 10, 99, 6], [11, 99])
    sub_user = [{"role": "user", "content": f"<system-reminder>x</system-reminder>\n\n{prompt}"}]
    sub = record([*SYSTEM, 2, 9, 99, 3], [40, 99], messages=sub_user)
    sub = sub.model_copy(update={"harness_ids": harness_ids(CLAUDE_SUB)})
    main3 = sent(CLAUDE_MAIN, [*SYSTEM, 2, 8, 99, 3, 10, 99, 6, 11, 99, 7], [12, 99])
    traces = build([main1, main2, sub, main3])
    root, branch = traces[main1.completion_id], traces[sub.completion_id]
    assert root.metadata["completion_ids"] == [c.completion_id for c in (main1, main2, main3)]
    assert (branch.lineage.kind, branch.lineage.parent_call) == (
        TraceKind.SUBAGENT,
        main1.completion_id,
    )
    assert root.lineage.disagreements == branch.lineage.disagreements == []
