"""Compacted sessions as one tree of traces: the summary request and the compacted history.

Codex 0.169.0 compacts locally (any provider not named OpenAI or azure) in two calls, as seen
on the wire through the gateway: the history with its last user message asking for a
"CONTEXT CHECKPOINT COMPACTION" and no tools (so its prompt extends no earlier prompt), then a
new history of the first messages and a summary message, in the thread's next context window
(``x-codex-window-id`` ``<thread>:1``). The prompts here are rendered by SmolLM2's real chat
template, tools in the system prompt as engines serving tool-less templates render them.
"""

from __future__ import annotations

from typing import Any

import pytest

from polar.capture.harness_ids import harness_ids
from polar.capture.records import CaptureRecord
from polar.schemas.trajectory import (
    CompactionEvidence,
    CompactionStep,
    Trace,
    TraceKind,
    Trajectory,
)
from polar.trajectory.per_request import PerRequestBuilder
from polar.trajectory.prefix_merging import PrefixMergingBuilder
from polar.turn_rewards.base import session_turns

from ..capture.test_harness_ids import CODEX_ROOT
from .sessions import TOOLS, Agent

SYSTEM = "You are a coding agent. Use the tools to work on files in the current directory."
TASK = "Create a file named proof.txt that contains the word polar."
CODEX_ASK = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another "
    "LLM that will resume the task."
)
SUMMARY_PREFIX = (
    "Another language model started to solve this problem and produced a summary of its "
    "thinking process. Here is the summary produced by the other language model:"
)


def windowed(call: CaptureRecord, window: int) -> CaptureRecord:
    """``call`` as Codex's root thread sent it, in context window ``window``."""
    thread = CODEX_ROOT["thread-id"]
    headers = {**CODEX_ROOT, "x-codex-window-id": f"{thread}:{window}"}
    return call.model_copy(update={"harness_ids": harness_ids(headers)})


class CodexSession:
    """Codex's thread: agent turns, then compactions (summary request, compacted history)."""

    def __init__(self, tok: Any, *, headers: bool = False, ask: str = CODEX_ASK) -> None:
        self.tok = tok
        self.headers = headers
        self.ask = ask
        self.window = 0
        self.agent = Agent(tok, system=SYSTEM, task=TASK, tools=TOOLS)
        self.calls: list[CaptureRecord] = []

    def _keep(self, call: CaptureRecord) -> CaptureRecord:
        call = windowed(call, self.window) if self.headers else call
        self.calls.append(call)
        return call

    def turn(self, command: str) -> CaptureRecord:
        call = self.agent.call("", tool_cmd=command)
        self.agent.tool_result(f"ran {command}")
        return self._keep(call)

    def finish(self, text: str) -> CaptureRecord:
        return self._keep(self.agent.call(text))

    def compact(self, summary: str) -> CaptureRecord:
        """The summary request (the history and the ask, no tools); then the next window opens
        on the first messages and the summary message, as Codex rebuilds its history."""
        asking = Agent(self.tok, system=None, tools=None)
        asking.messages = [*self.agent.messages, {"role": "user", "content": self.ask}]
        request = self._keep(asking.call(summary))
        self.window += 1
        self.agent = Agent(self.tok, system=SYSTEM, task=TASK, tools=TOOLS)
        self.agent.user(f"{SUMMARY_PREFIX}\n{summary}")
        return request


def two_windows(tok: Any, **session: Any) -> tuple[CodexSession, list[CaptureRecord]]:
    """Three turns, a compaction, two turns of the compacted history."""
    codex = CodexSession(tok, **session)
    main = [codex.turn(f"echo step{i}") for i in range(3)]
    summary = codex.compact("Wrote nothing yet; next: write proof.txt with the word polar.")
    after = [codex.turn("echo polar > proof.txt"), codex.finish("All done.")]
    return codex, [*main, summary, *after]


def by_first_call(trajectory: Trajectory) -> dict[str, Trace]:
    return {t.stats.completion_ids[0]: t for t in trajectory.traces}


def assert_one_exact_tree(trajectory: Trajectory) -> None:
    """One root (the main agent's first trace); every other trace's parent call is held by
    the trace its parent_trace names; every merged call's context is its engine prompt."""
    roots = [
        t for t in trajectory.traces if t.lineage is not None and t.lineage.parent_call is None
    ]
    assert [t.lineage.kind for t in roots if t.lineage] == [TraceKind.MAIN]
    for trace in trajectory.traces:
        lineage = trace.lineage
        assert lineage is not None
        if lineage.parent_call is not None:
            assert lineage.parent_trace is not None
            holder = trajectory.traces[lineage.parent_trace]
            assert lineage.parent_call in holder.stats.completion_ids
        assert trace.stats.context_exact_calls == trace.stats.merged_calls
    assert trajectory.stats.context_exact_calls == trajectory.stats.merged_calls


@pytest.mark.parametrize("headers", [False, True], ids=["prompts", "codex-headers"])
def test_a_codex_compaction_is_a_summary_trace_and_a_continuation_under_the_main_trace(
    smollm2: Any, headers: bool
) -> None:
    _, calls = two_windows(smollm2, headers=headers)
    main1, _, main3, summary, after1, after2 = calls
    assert summary.prompt_ids[: len(main3.prompt_ids)] != main3.prompt_ids  # no tools
    trajectory = PrefixMergingBuilder().build(calls)
    traces = by_first_call(trajectory)
    assert len(trajectory.traces) == 3
    main = traces[main1.completion_id]
    assert main.lineage is not None and main.lineage.kind is TraceKind.MAIN
    assert main.stats.num_calls == 3

    asked = traces[summary.completion_id].lineage
    assert asked is not None and asked.compaction is not None
    assert (asked.kind, asked.reason) == (TraceKind.COMPACTION, "summary_request")
    assert asked.compaction.step is CompactionStep.SUMMARY
    assert asked.compaction.evidence == [CompactionEvidence.CODEX_SUMMARY_PROMPT]
    assert asked.parent_call == main3.completion_id  # the history it summarises ends there
    assert asked.parent_trace == trajectory.traces.index(main)

    compacted = traces[after1.completion_id]
    lineage = compacted.lineage
    assert lineage is not None and lineage.compaction is not None
    assert lineage.kind is TraceKind.COMPACTION and lineage.reason == "summary_marker"
    assert lineage.compaction.step is CompactionStep.CONTINUATION
    assert lineage.compaction.summary_call == summary.completion_id
    assert lineage.parent_call == main3.completion_id
    assert lineage.parent_trace == trajectory.traces.index(main)
    window = [CompactionEvidence.CODEX_WINDOW] if headers else []
    assert lineage.compaction.evidence == [CompactionEvidence.CODEX_SUMMARY_MESSAGE, *window]
    assert compacted.stats.completion_ids == [after1.completion_id, after2.completion_id]
    assert compacted.stats.merged_calls == 1
    assert all(not t.lineage.disagreements for t in trajectory.traces if t.lineage)
    assert trajectory.metadata["trace_kinds"] == {"compaction": 2, "main": 1}
    assert_one_exact_tree(trajectory)


def test_per_request_gives_the_compaction_the_same_links(smollm2: Any) -> None:
    _, calls = two_windows(smollm2, headers=True)
    main1, main2, main3, summary, after1, after2 = calls
    traces = by_first_call(PerRequestBuilder().build(calls))
    expect = [
        (main1, TraceKind.MAIN, None, None),
        (main2, TraceKind.MAIN, main1, None),
        (main3, TraceKind.MAIN, main2, None),
        (summary, TraceKind.COMPACTION, main3, CompactionStep.SUMMARY),
        (after1, TraceKind.COMPACTION, main3, CompactionStep.CONTINUATION),
        (after2, TraceKind.COMPACTION, after1, None),  # the compacted agent goes on
    ]
    for call, kind, parent, step in expect:
        lineage = traces[call.completion_id].lineage
        assert lineage is not None
        assert lineage.kind is kind, call.completion_id
        assert lineage.parent_call == (parent.completion_id if parent else None)
        assert (lineage.compaction.step if lineage.compaction else None) is step


def test_the_summary_request_follows_the_last_turn_for_turn_rewards(smollm2: Any) -> None:
    """The summary request carries the last turn's tool result (the compacted history does
    not), so a turn reward reading the next call of the agent reads it there."""
    _, calls = two_windows(smollm2, headers=True)
    turns = {t.call.completion_id: t for t in session_turns(calls)}
    main3, summary = calls[2], calls[3]
    following = turns[main3.completion_id].following
    assert following is not None and following.completion_id == summary.completion_id


def test_a_second_compaction_hangs_under_the_first_compacted_history(smollm2: Any) -> None:
    codex, calls = two_windows(smollm2, headers=True)
    second = codex.compact("Wrote proof.txt; nothing remains.")
    later = codex.finish("Checked again: done.")
    calls += [second, later]
    trajectory = PrefixMergingBuilder().build(calls)
    traces = by_first_call(trajectory)
    first_history = traces[calls[4].completion_id]
    asked = traces[second.completion_id].lineage
    assert asked is not None and asked.compaction is not None
    assert asked.compaction.step is CompactionStep.SUMMARY
    assert asked.parent_call == calls[5].completion_id
    lineage = traces[later.completion_id].lineage
    assert lineage is not None and lineage.compaction is not None
    assert lineage.compaction.step is CompactionStep.CONTINUATION
    assert lineage.compaction.summary_call == second.completion_id
    assert lineage.parent_call == calls[5].completion_id
    assert lineage.parent_trace == trajectory.traces.index(first_history)
    assert trajectory.metadata["trace_kinds"] == {"compaction": 4, "main": 1}
    assert_one_exact_tree(trajectory)


def test_a_compact_prompt_of_the_users_own_is_found_by_the_summary_it_produced(
    smollm2: Any,
) -> None:
    """Codex's ``compact_prompt`` replaces the ask, so no phrase tells; the compacted history
    carries the reply verbatim, and the call that sampled it (same thread) is its summary."""
    _, calls = two_windows(smollm2, headers=True, ask="Summarise the work so far, briefly.")
    main3, summary, after1 = calls[2], calls[3], calls[4]
    traces = by_first_call(PrefixMergingBuilder().build(calls))
    asked = traces[summary.completion_id].lineage
    assert asked is not None and asked.compaction is not None
    assert asked.compaction.evidence == [CompactionEvidence.SUMMARY_CARRIED]
    assert asked.parent_call == main3.completion_id
    lineage = traces[after1.completion_id].lineage
    assert lineage is not None and lineage.compaction is not None
    assert lineage.compaction.summary_call == summary.completion_id


def test_codexs_compact_header_names_a_summary_request(smollm2: Any) -> None:
    codex = CodexSession(smollm2, headers=True, ask="Summarise the work so far, briefly.")
    main = [codex.turn("echo one"), codex.turn("echo two")]
    summary = codex.compact("Ran two echoes.")
    compact = {**CODEX_ROOT, "x-openai-subagent": "compact"}
    summary = summary.model_copy(update={"harness_ids": harness_ids(compact)})
    traces = by_first_call(PrefixMergingBuilder().build([*main, summary]))
    asked = traces[summary.completion_id].lineage
    assert asked is not None and asked.compaction is not None
    assert asked.compaction.evidence == [CompactionEvidence.CODEX_COMPACT_HEADER]
    assert asked.parent_call == main[1].completion_id


def test_the_trajectory_view_names_each_compaction_step(smollm2: Any) -> None:
    from polar.trajectory.html import TokenText, trace_view

    _, calls = two_windows(smollm2)
    trajectory = PrefixMergingBuilder().build(calls)
    views = {
        t.stats.completion_ids[0]: trace_view(t, i, TokenText(smollm2)).lineage
        for i, t in enumerate(trajectory.traces)
    }
    assert views[calls[3].completion_id] == "compaction summary of trace 0 (summary_request)"
    assert views[calls[4].completion_id] == "compaction continuation of trace 0 (summary_marker)"
