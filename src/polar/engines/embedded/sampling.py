"""Sampling for the embedded engine, and the logprobs it reports for each sampled token.

Two logprob modes, chosen per engine and recorded with every completion:

* ``raw`` (the default, as vLLM): log-softmax of the model's unmodified logits at that step,
  exactly what a teacher-forced forward pass over the same ids gives. A trainer recomputing its
  old-policy logprobs sees the same numbers.
* ``processed``: log-softmax of the distribution actually sampled from, after temperature,
  top-k and top-p (tokens removed by top-k/top-p have logprob ``-inf``). Greedy decoding
  (temperature 0) has no scaled distribution, so there ``processed`` equals ``raw``.

Each request draws from its own seeded ``torch.Generator``, so a given seed reproduces its
samples whatever else the engine is doing; a request without a seed gets a random one, which
is recorded so the sample can be reproduced.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from typing import Any

import torch

from polar.engines.embedded.options import LOGPROBS_MODES
from polar.errors import InvalidRequest

MAX_TOP_LOGPROBS = 20
# Below this temperature, sampling is greedy (the same threshold vLLM uses).
GREEDY_EPSILON = 1e-5


@dataclass(frozen=True)
class GenerationParams:
    """Validated sampling parameters of one request (chat-completions names and defaults)."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = True
    top_logprobs: int = 0
    ignored: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequest(
                f"temperature must be a finite number >= 0, got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise InvalidRequest(f"top_k must be -1 or 0 (disabled) or >= 1, got {self.top_k}")
        if self.n < 1:
            raise InvalidRequest(f"n must be at least 1, got {self.n}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(
                f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}"
            )
        if any(not s for s in self.stop):
            raise InvalidRequest("stop strings must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPSILON


@dataclass
class StepOutput:
    """One decode step for every row: the sampled ids, their logprobs, optional top-k."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    top_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None


class Sampler:
    """Picks the next token of each row from its logits, under one request's parameters."""

    def __init__(self, params: GenerationParams, logprobs_mode: str = "raw") -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}"
            )
        self.params = params
        self.logprobs_mode = logprobs_mode
        self.seed = params.seed if params.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator().manual_seed(self.seed)

    def step(self, logits: torch.Tensor) -> StepOutput:
        """Sample from ``logits`` of shape ``[rows, vocab]`` (any float dtype)."""
        logits = logits.float()
        raw = torch.log_softmax(logits, dim=-1)
        if self.params.greedy:
            token_ids = logits.argmax(dim=-1)
            reported = raw
        else:
            processed = torch.log_softmax(self._processed_logits(logits), dim=-1)
            token_ids = self._draw(processed.exp())
            reported = raw if self.logprobs_mode == "raw" else processed
        out = StepOutput(token_ids, reported.gather(-1, token_ids[:, None]).squeeze(-1))
        if self.params.top_logprobs:
            out.top_logprobs, out.top_ids = reported.topk(self.params.top_logprobs, dim=-1)
        return out

    def _draw(self, probs: torch.Tensor) -> torch.Tensor:
        """Inverse-CDF sampling: one uniform draw per row (much cheaper than multinomial on CPU).

        The first id whose cumulative mass exceeds the draw is chosen, so ids of zero
        probability never are (a draw rounded up to the total mass takes the likeliest id).
        """
        cdf = probs.cumsum(dim=-1)
        draw = torch.rand((probs.shape[0], 1), generator=self.generator) * cdf[:, -1:]
        chosen = torch.searchsorted(cdf, draw, right=True)
        chosen = torch.where(chosen < probs.shape[-1], chosen, probs.argmax(dim=-1, keepdim=True))
        return chosen.squeeze(-1)

    def _processed_logits(self, logits: torch.Tensor) -> torch.Tensor:
        scaled = logits / self.params.temperature
        top_k = self.params.top_k
        if 0 < top_k < scaled.shape[-1]:
            kth = scaled.topk(top_k, dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if self.params.top_p < 1.0:
            ordered, order = scaled.sort(dim=-1, descending=True)
            probs = ordered.softmax(dim=-1)
            # Drop a token once the mass before it already reaches top_p; the first always stays.
            drop = (probs.cumsum(dim=-1) - probs) >= self.params.top_p
            drop[:, 0] = False
            ordered = ordered.masked_fill(drop, float("-inf"))
            scaled = torch.empty_like(scaled).scatter_(-1, order, ordered)
        return scaled

    def record(self) -> dict[str, Any]:
        """The parameters that produced the samples, as stored with the completion."""
        p = self.params
        record: dict[str, Any] = {
            "temperature": p.temperature,
            "top_p": p.top_p,
            "top_k": p.top_k,
            "max_tokens": p.max_tokens,
            "seed": self.seed,
            "n": p.n,
            "stop": list(p.stop),
            "stop_token_ids": list(p.stop_token_ids),
            "ignore_eos": p.ignore_eos,
            "logprobs_mode": self.logprobs_mode,
        }
        if p.ignored:
            record["ignored_params"] = list(p.ignored)
        return record
