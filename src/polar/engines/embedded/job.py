"""One request's state as it moves through the scheduler: prefill, then decode.

Apart from the scheduler so that the result writer and the core can name a request without
importing the scheduling loop.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from polar.engines.embedded.kv_cache import common_prefix_length
from polar.engines.embedded.results import GenerationResult
from polar.engines.embedded.sampling import GenerationParams, Sampler
from polar.rendering.chat_template import RenderedPrompt


@dataclass
class Row:
    """One choice being sampled: its ids, logprobs and, once stopped, why."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass
class Job:
    """One request moving through the scheduler: prefill, then decode (usually batched)."""

    prompt: RenderedPrompt
    params: GenerationParams
    max_tokens: int
    sampler: Sampler
    parse_tools: bool
    single_tool_call: bool = False
    future: Future[GenerationResult] = field(default_factory=Future)
    submitted: float = field(default_factory=time.perf_counter)
    version: int = 0
    started: float = 0.0
    prefilled: float = 0.0
    cache: Any = None  # its own cache, for a model the decode batch cannot hold
    begun: bool = False  # reading its prompt (or past it)
    position: int = 0  # prompt tokens run so far
    reused: int = 0
    _tokens: np.ndarray | None = None
    rows: list[Row] = field(default_factory=list)
    sampled: int = 0  # decode steps taken (tokens sampled per row)
    last_tokens: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    first_row: int | None = None  # where its rows sit in the batch (from its prefill on)
    decoding: bool = False
    done: bool = False
    failed: bool = False
    outcome: GenerationResult | Exception | None = None

    def rows_slice(self) -> slice:
        start = self.first_row or 0
        return slice(start, start + self.params.n)

    def fail(self, error: Exception) -> None:
        self.outcome, self.done, self.failed = error, True, True

    @property
    def tokens(self) -> np.ndarray:
        """The prompt ids as an array, for prefix comparisons."""
        if self._tokens is None:
            self._tokens = np.asarray(self.prompt.ids, dtype=np.int64)
        return self._tokens

    @property
    def prefilling(self) -> bool:
        """Started reading its prompt and not finished: its row holds ``position`` tokens."""
        return self.begun and not self.decoding and not self.done

    def shared_with(self, other: Job) -> int:
        """Leading prompt tokens the two requests have in common."""
        return common_prefix_length(self.tokens, other.tokens)


def settle(future: Future[GenerationResult], outcome: GenerationResult | Exception | None) -> None:
    """Resolve ``future`` unless its caller already gave up on it (or it was cancelled)."""
    if outcome is None:
        return
    try:
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:
        pass
