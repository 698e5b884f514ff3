"""Opt-in: gateway-side rendering against a real vLLM, checked by an independent tap.

Skipped unless ``POLAR_VLLM_URL`` points at a vLLM server (without ``/v1``) serving SmolLM2
with tool support (see docs/engines.md). Sessions are driven like a harness (replies fed back,
tool-call arguments re-serialized, tool results and user turns added); a reverse proxy between
gateway and vLLM records the prompt ids vLLM reports for every call.

    POLAR_VLLM_URL=http://127.0.0.1:8000 pytest -m vllm tests/integration/test_vllm_render.py
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

VLLM_URL = os.environ.get("POLAR_VLLM_URL")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        not VLLM_URL, reason="set POLAR_VLLM_URL to a vLLM server (see docs/engines.md)"
    ),
]


def _bench() -> object:
    path = Path(__file__).parents[2] / "bench" / "render_modes.py"
    spec = importlib.util.spec_from_file_location("render_modes", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_every_merged_context_is_what_vllm_saw_with_gateway_rendering() -> None:
    result = await _bench().run_mode(VLLM_URL, "gateway", sessions=3, turns=4)  # type: ignore[attr-defined]
    assert result["calls"] == 12
    assert result["merged_exact_builder"] >= 9, result  # multi-turn sessions stay merged
    assert result["context_exact_exact_builder"] == result["merged_exact_builder"], result
    assert result["calls_per_trace_exact"] > 3, result


async def test_engine_rendering_splits_instead_of_merging_wrong_contexts() -> None:
    result = await _bench().run_mode(VLLM_URL, "engine", sessions=3, turns=4)  # type: ignore[attr-defined]
    assert result["context_exact_exact_builder"] == result["merged_exact_builder"], result
