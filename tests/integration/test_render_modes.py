"""Real CLIs against an engine that samples non-canonically, in both render modes.

The engine pretty-prints tool-call JSON and tokenizes text the way re-encoding does not, as
real models do. With engine-side rendering the next prompt re-renders that turn differently,
so the exact builder splits the session (and says why); with gateway-side rendering every
prompt extends the sampled ids, so the session is one trace whose every call saw exactly its
context. Either way no merged call's context differs from its engine prompt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polar.engines.scripted import ScriptedReply
from polar.trajectory.registry import create_builder

from .harness_kit import COMMAND, FINAL, harness_prefix, run_cli

__all__ = ["harness_prefix"]

pytestmark = pytest.mark.slow

CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "pi": ("bash", {"command": COMMAND}),
    "codex": ("exec_command", {"cmd": COMMAND}),
    "claude_code": ("Bash", {"command": COMMAND, "description": "Write the proof file"}),
}


@pytest.mark.parametrize("harness", ["pi", "codex", "claude_code"])
async def test_merged_contexts_are_exact_in_both_render_modes(
    noncanonical_gateway: Any, tmp_path: Path, harness_prefix: Path, harness: str
) -> None:
    replies = [
        ScriptedReply(content="I will write it.", tool_calls=[CALLS[harness]]),
        ScriptedReply(content=FINAL),
    ]
    run = await run_cli(noncanonical_gateway, tmp_path, harness_prefix, harness, replies)
    assert run.outcome.exit_code == 0, run.outcome
    assert (run.workspace / "proof.txt").read_text() == "polar\n"
    agent = [r for r in run.records if not r.tags]
    assert len(agent) == 2, [r.response for r in run.records]
    trajectory = create_builder("prefix_merging").build(agent)
    meta = trajectory.metadata
    assert meta["context_exact_calls"] == meta["merged_calls"]
    if noncanonical_gateway.render_mode == "gateway":
        first, second = agent
        assert "prompt_extends_sampled_turn" in second.flags
        assert second.prompt_ids[: len(first.prompt_ids) + len(first.sampled_ids)] == (
            first.prompt_ids + first.sampled_ids
        )
        assert meta["num_traces"] == 1 and meta["merged_calls"] == 1, meta
        assert meta["breaks"] == {}
    else:
        assert meta["num_traces"] == 2, meta
        assert meta["breaks"] == {"context_drift": 1}
        assert meta["drift_tokens"] > 0
