"""Padding traces into a batch, and response logprobs against a per-sequence recomputation."""

from __future__ import annotations

import math

import pytest
import torch

from polar.engines.embedded import EmbeddedEngineCore, GenerationParams, load_model
from polar.schemas.trajectory import Trace
from polar.training.advantages import ScoredTrace
from polar.training.batch import make_batch, response_logprobs


def item(
    prompt: list[int], response: list[int], mask: list[int], lp: list[float] | None
) -> ScoredTrace:
    trace = Trace(prompt_ids=prompt, response_ids=response, loss_mask=mask, response_logprobs=lp)
    return ScoredTrace(trace, "s", "g", 0.5, 1.0)


def test_make_batch_aligns_responses() -> None:
    batch = make_batch(
        [item([1, 2, 3], [4, 5], [1, 0], [-0.5, 0.0]), item([1], [6, 7, 8], [1, 1, 1], None)],
        [0.25, 0.125],
        pad_id=0,
    )
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5], [1, 6, 7, 8, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert batch.loss_mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    assert batch.rollout_logprobs[0, :2].tolist() == [-0.5, 0.0]
    assert (
        torch.isnan(batch.rollout_logprobs[0, 2]) and torch.isnan(batch.rollout_logprobs[1]).all()
    )
    assert batch.has_rollout_logprobs.tolist() == [True, False]
    assert batch.weights.tolist() == [0.25, 0.125] and batch.advantages.tolist() == [0.5, 0.5]
    with pytest.raises(ValueError, match="prompt"):
        make_batch([item([], [1], [1], None)], [1.0])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_response_logprobs_match_the_engine(temperature: float) -> None:
    """The trainer's teacher-forced logprobs equal what the engine reported while sampling."""
    loaded = load_model("tiny")
    mode = "raw" if temperature == 1.0 else "processed"
    core = EmbeddedEngineCore(loaded, logprobs_mode=mode)
    try:
        rows = []
        for text, n in (("hello there", 5), ("a much longer prompt to pad the other row", 3)):
            result = core.generate_sync(
                [{"role": "user", "content": text}],
                params=GenerationParams(
                    max_tokens=n, temperature=temperature, seed=1, ignore_eos=True
                ),
            )
            [choice] = result.choices
            rows.append(item(result.prompt_ids, choice.token_ids, [1] * n, choice.logprobs))
    finally:
        core.close()
    batch = make_batch(rows, [1.0, 1.0], pad_id=0)
    with torch.no_grad():
        got = response_logprobs(loaded.module, batch, temperature)
    for i, row in enumerate(rows):
        n = len(row.trace.response_ids)
        assert got[i, :n].tolist() == pytest.approx(row.trace.response_logprobs, abs=2e-4)
        assert got[i, n:].abs().sum().item() == 0.0
    assert all(math.isfinite(v) for v in got.flatten().tolist())
