"""OpenAI Codex CLI, the real CLI, two turns through the gateway in a loopback-only sandbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polar.harnesses.codex import COMPACT_SETTINGS
from polar.stack.demonstrator import shell_tool

from .harness_kit import TASK, assert_two_turn_run, harness_prefix, run_two_turns, shell_call

__all__ = ["harness_prefix"]

pytestmark = pytest.mark.slow


async def test_codex_two_turns(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path, tokenizer: Any
) -> None:
    tool_call = shell_call("codex")
    run = await run_two_turns(live_gateway, tmp_path, harness_prefix, "codex", tool_call)
    assert_two_turn_run(run, tokenizer, "exec_command")
    assert {r.provider for r in run.records} == {"openai_responses"}


async def test_codex_compact_settings_shrink_the_first_prompt(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path, tokenizer: Any
) -> None:
    """The compact preset, through the real CLI: its own instructions file replaces the stock
    base instructions, the skills/permissions/environment blocks and view_image are gone, and
    exec_command still runs the command. Default and compact first prompts are measured in
    SmolLM2 tokens as the gateway rendered them (docs/harnesses.md quotes the figures)."""
    tool_call = shell_call("codex")
    stock = await run_two_turns(
        live_gateway, tmp_path / "stock", harness_prefix, "codex", tool_call
    )
    compact = await run_two_turns(
        live_gateway, tmp_path / "compact", harness_prefix, "codex", tool_call, COMPACT_SETTINGS
    )
    assert_two_turn_run(compact, tokenizer, "exec_command")
    request = compact.records[0].request
    assert request is not None
    texts = [part["text"] for item in request["input"] for part in item.get("content", [])]
    assert texts == [COMPACT_SETTINGS["instructions"], TASK]
    tools = {tool["name"]: tool for tool in request["tools"]}
    assert "exec_command" in tools and "view_image" not in tools
    # the demonstrator's call is the one Codex's own schema asks for: a ``cmd`` string
    schema = tools["exec_command"]["parameters"]
    argument = shell_tool("codex").argument
    assert schema["required"] == [argument] and schema["properties"][argument]["type"] == "string"
    default_ids, compact_ids = stock.records[0].prompt_ids, compact.records[0].prompt_ids
    print(f"codex first prompt: {len(default_ids)} tokens stock, {len(compact_ids)} compact")
    assert len(compact_ids) * 4 < len(default_ids)
