"""Qwen Code, the real CLI, two turns through the gateway in a loopback-only sandbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .harness_kit import assert_two_turn_run, harness_prefix, run_two_turns, shell_call

__all__ = ["harness_prefix"]

pytestmark = pytest.mark.slow


async def test_qwen_code_two_turns(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path, tokenizer: Any
) -> None:
    tool_call = shell_call("qwen_code")
    run = await run_two_turns(live_gateway, tmp_path, harness_prefix, "qwen_code", tool_call)
    assert_two_turn_run(run, tokenizer, "run_shell_command")
    assert {r.provider for r in run.records} == {"openai_chat"}
