"""Scored traces as padded tensors, and the per-token logprobs a causal LM gives their responses.

Each row is ``prompt_ids + response_ids``, right-padded; the response occupies columns
``[0, len(response))`` of the ``[B, T]`` tensors the loss reads, so a row's loss mask, rollout
logprobs and weights line up with its response tokens exactly as the trace recorded them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from polar.training.advantages import ScoredTrace


@dataclass
class Batch:
    """One microbatch: model inputs and the response-aligned tensors of the loss."""

    input_ids: torch.Tensor  # [B, L] prompt + response, right-padded
    attention_mask: torch.Tensor  # [B, L]
    prompt_lengths: list[int]
    response_lengths: list[int]
    loss_mask: torch.Tensor  # [B, T] T = longest response
    rollout_logprobs: torch.Tensor  # [B, T]; nan where the trace had none
    advantages: torch.Tensor  # [B]
    weights: torch.Tensor  # [B]

    @property
    def has_rollout_logprobs(self) -> torch.Tensor:
        """[B] whether each row carries the engine's logprobs."""
        return ~torch.isnan(self.rollout_logprobs).all(dim=1)


def make_batch(items: Sequence[ScoredTrace], weights: Sequence[float], pad_id: int = 0) -> Batch:
    """Pad ``items`` (with their loss ``weights``) into one :class:`Batch`."""
    if any(not s.trace.prompt_ids for s in items):
        raise ValueError(
            "a trace without prompt ids cannot be scored (nothing predicts its first token)"
        )
    rows = [s.trace.prompt_ids + s.trace.response_ids for s in items]
    width = max(len(r) for r in rows)
    span = max(len(s.trace.response_ids) for s in items)
    n = len(items)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, span), dtype=torch.long)
    rollout = torch.full((n, span), float("nan"), dtype=torch.float32)
    for i, (row, s) in enumerate(zip(rows, items, strict=True)):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        r = len(s.trace.response_ids)
        mask[i, :r] = torch.tensor(s.trace.loss_mask)
        if s.trace.response_logprobs is not None:
            rollout[i, :r] = torch.tensor(s.trace.response_logprobs)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention,
        prompt_lengths=[len(s.trace.prompt_ids) for s in items],
        response_lengths=[len(s.trace.response_ids) for s in items],
        loss_mask=mask,
        rollout_logprobs=rollout,
        advantages=torch.tensor([s.advantage for s in items], dtype=torch.float32),
        weights=torch.tensor(list(weights), dtype=torch.float32),
    )


def response_logprobs(module: Any, batch: Batch, temperature: float = 1.0) -> torch.Tensor:
    """``[B, T]`` logprob of each response token under ``module`` (0 past a row's response),
    from logits divided by ``temperature``: the distribution the engine sampled from.

    Logits at position ``p`` predict token ``p + 1``, so a response starting at ``P`` reads the
    logits at ``P - 1 .. P + R - 2``; only those positions go through the log-softmax.
    """
    out = module(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    logits = out.logits
    span = batch.loss_mask.shape[1]
    result = torch.zeros((len(batch.prompt_lengths), span), dtype=torch.float32)
    rows = []
    for i, (p, r) in enumerate(zip(batch.prompt_lengths, batch.response_lengths, strict=True)):
        step = logits[i, p - 1 : p + r - 1].float() / temperature
        targets = batch.input_ids[i, p : p + r]
        chosen = step.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(step, dim=-1)
        rows.append(torch.cat([chosen, result.new_zeros(span - r)]))
    return torch.stack(rows) if rows else result
