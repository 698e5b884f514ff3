"""Pi, the real CLI, two turns through the gateway in a loopback-only sandbox; all four APIs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from polar.engines.scripted import ScriptedReply
from polar.errors import HarnessError, HarnessTimeout
from polar.harnesses.pi import PI_APIS

from .harness_kit import (
    assert_two_turn_run,
    harness_prefix,
    run_cli,
    run_two_turns,
    shell_call,
)

__all__ = ["harness_prefix"]

pytestmark = pytest.mark.slow


async def test_pi_two_turns(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path, tokenizer: Any
) -> None:
    run = await run_two_turns(live_gateway, tmp_path, harness_prefix, "pi", shell_call("pi"))
    assert_two_turn_run(run, tokenizer, "bash")
    assert {r.provider for r in run.records} == {"openai_chat"}


async def test_pi_four_api_modes_capture_the_same_tokens(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path, tokenizer: Any
) -> None:
    providers = {}
    sampled = {}
    for api in PI_APIS:
        run = await run_two_turns(
            live_gateway,
            tmp_path / api,
            harness_prefix,
            "pi",
            shell_call("pi"),
            settings={"api": api},
        )
        assert_two_turn_run(run, tokenizer, "bash")
        providers[api] = {r.provider for r in run.records}
        sampled[api] = [(r.sampled_ids, r.logprobs) for r in run.records]
    assert providers == {
        "openai-completions": {"openai_chat"},
        "openai-responses": {"openai_responses"},
        "anthropic-messages": {"anthropic"},
        "google-generative-ai": {"google"},
    }
    first = sampled["openai-completions"]
    assert all(calls == first for calls in sampled.values())


async def test_engine_error_ends_the_cli_with_a_harness_error_carrying_its_stderr(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path
) -> None:
    refusal = ScriptedReply(error_status=400, error_message="prompt is over the polar test limit")
    with pytest.raises(HarnessError, match="pi exited with status 1") as info:
        await run_cli(live_gateway, tmp_path, harness_prefix, "pi", [refusal])
    assert "prompt is over the polar test limit" in info.value.stderr_tail


async def test_a_cli_waiting_on_a_slow_engine_is_killed_at_the_deadline(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path
) -> None:
    slow = ScriptedReply(content="late", delay_s=8)
    began = time.monotonic()
    with pytest.raises(HarnessTimeout, match="pi did not finish within 3s"):
        await run_cli(live_gateway, tmp_path, harness_prefix, "pi", [slow], timeout_s=3)
    assert time.monotonic() - began < 8
