"""Real CLIs spawning sub-agents on the scripted engine: the session tree from their calls alone.

Claude Code through its Agent tool (formerly Task), opencode through its task tool (a child
session). Each yields the main trace and a sub-agent trace parented on the spawning call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polar.engines.scripted import ScriptedReply
from polar.engines.scripted_script import ConversationScript
from polar.schemas.trajectory import TraceKind
from polar.training.advantages import SessionSample, compute_advantages
from polar.trajectory.registry import create_builder

from .harness_kit import FINAL, TASK, harness_prefix, run_cli

__all__ = ["harness_prefix"]

pytestmark = pytest.mark.slow

SUB_TASK = "List the files in the current directory and report them."


async def test_claude_code_subagent_is_a_branch_of_the_main_trace(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path
) -> None:
    """Answered by conversation, not by order: Claude Code 2.1.197 waits for its sub-agent,
    2.1.332 runs it in the background (the main agent calls again after "agent launched" and
    once more on the sub-agent's task notification), and the tree must be right for both."""
    task_call = (
        "Agent",
        {
            "description": "List files",
            "prompt": SUB_TASK,
            "subagent_type": "general-purpose",
        },
    )
    # The sub-agent's prompt is in its own conversation and, once spawned, in the main one's
    # (the Agent call): at turn 0 only the sub-agent's; before the spawn, the main task's.
    live_gateway.engine.backend.script = ConversationScript(
        {
            SUB_TASK: [ScriptedReply(content="There are no files.")],
            TASK: [ScriptedReply(tool_calls=[task_call])],
        },
        default=ScriptedReply(content=FINAL),
    )
    run = await run_cli(live_gateway, tmp_path, harness_prefix, "claude_code", [])
    assert run.outcome.exit_code == 0, run.outcome
    agent = [r for r in run.records if not r.tags]
    assert all(r.harness_ids is not None for r in agent), [r.harness_ids for r in agent]
    session = agent[0].harness_ids.session if agent[0].harness_ids else None
    subs = [r for r in agent if r.harness_ids and r.harness_ids.agent != session]
    mains = [r for r in agent if r not in subs]
    assert len(subs) == 1 and len(mains) in (2, 3), [(r.harness_ids, r.response) for r in agent]
    (sub,), main1 = subs, mains[0]
    tools = [t["name"] for t in (main1.request or {}).get("tools", [])]
    assert "Agent" in tools, tools

    trajectory = create_builder("prefix_merging").build(run.records)
    by_first = {t.metadata["completion_ids"][0]: t for t in trajectory.traces}
    assert set(by_first) == {main1.completion_id, sub.completion_id}
    root, branch = by_first[main1.completion_id], by_first[sub.completion_id]
    assert root.lineage is not None and root.lineage.kind is TraceKind.MAIN
    assert root.metadata["completion_ids"] == [r.completion_id for r in mains]
    assert branch.lineage is not None
    assert branch.lineage.kind is TraceKind.SUBAGENT
    assert branch.lineage.reason == "claude_code_subagent_prompt"
    assert branch.lineage.parent_call == main1.completion_id  # the call that spawned it
    assert branch.lineage.parent_trace == trajectory.traces.index(root)
    assert sum(branch.loss_mask) == len(sub.sampled_ids)
    # the tree's ids are Claude Code's own headers (the session id on every call, the
    # sub-agent's agent id on its own), and they agree with prefix inference
    assert main1.harness_ids is not None and sub.harness_ids is not None
    assert (main1.harness_ids.agent, sub.harness_ids.parent) == (main1.harness_ids.session,) * 2
    assert root.lineage.harness is not None and branch.lineage.harness is not None
    assert branch.lineage.harness.parent == root.lineage.harness.agent
    assert root.lineage.disagreements == branch.lineage.disagreements == []

    # one logical rollout: both traces share the session's advantage against its group
    samples = [
        SessionSample(run.key, "g", "COMPLETED", 1.0, tuple(trajectory.traces)),
        SessionSample("other", "g", "COMPLETED", 0.0, ()),
    ]
    scored, _ = compute_advantages(samples)
    mine = [s.advantage for s in scored if s.session_id == run.key]
    assert len(mine) == 2 and mine[0] == mine[1] > 0


async def test_opencode_subagent_is_a_branch_of_the_main_trace(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path
) -> None:
    task_call = (
        "task",
        {"description": "List files", "prompt": SUB_TASK, "subagent_type": "general"},
    )
    replies = [
        ScriptedReply(tool_calls=[task_call]),
        ScriptedReply(content="There are no files."),
        ScriptedReply(content=FINAL),
    ]
    run = await run_cli(live_gateway, tmp_path, harness_prefix, "opencode", replies)
    assert run.outcome.exit_code == 0, run.outcome
    agent = [r for r in run.records if not r.tags]
    assert len(agent) == 3, [(r.tags, r.response) for r in run.records]
    main1, sub, main2 = agent
    assert sub.upstream_request["messages"][-1]["content"] == SUB_TASK

    trajectory = create_builder("prefix_merging").build(run.records)
    by_first = {t.metadata["completion_ids"][0]: t for t in trajectory.traces}
    root, branch = by_first[main1.completion_id], by_first[sub.completion_id]
    assert root.metadata["completion_ids"] == [main1.completion_id, main2.completion_id]
    assert branch.lineage is not None
    assert (branch.lineage.kind, branch.lineage.reason) == (
        TraceKind.SUBAGENT,
        "shares_only_system_prefix",
    )
    assert branch.lineage.parent_call == main1.completion_id
    # opencode's own session ids: the child session names the main one as its parent
    assert root.lineage.harness is not None and branch.lineage.harness is not None
    assert branch.lineage.harness.parent == root.lineage.harness.agent
    assert root.lineage.disagreements == branch.lineage.disagreements == []
