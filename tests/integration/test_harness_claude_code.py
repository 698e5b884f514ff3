"""Claude Code, the real CLI, two turns through the gateway in a loopback-only sandbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .harness_kit import COMMAND, assert_two_turn_run, harness_prefix, run_two_turns

__all__ = ["harness_prefix"]

pytestmark = pytest.mark.slow


async def test_claude_code_two_turns(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path, tokenizer: Any
) -> None:
    tool_call = ("Bash", {"command": COMMAND, "description": "Write the proof file"})
    run = await run_two_turns(live_gateway, tmp_path, harness_prefix, "claude_code", tool_call)
    assert_two_turn_run(run, tokenizer, "Bash")
    assert {r.provider for r in run.records} == {"anthropic"}
