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
from torch.utils.checkpoint import checkpoint

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
    advantages: torch.Tensor  # [B], or [B, T] when a trace carries turn-level credit
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
        advantages=_advantages(items, span),
        weights=torch.tensor(list(weights), dtype=torch.float32),
    )


def _advantages(items: Sequence[ScoredTrace], span: int) -> torch.Tensor:
    """``[B]`` session advantages, or ``[B, T]`` with each row's turn-level bonus added."""
    flat = torch.tensor([s.advantage for s in items], dtype=torch.float32)
    if all(s.token_bonus is None for s in items):
        return flat
    out = flat[:, None].repeat(1, span)
    for i, s in enumerate(items):
        if s.token_bonus is not None:
            out[i, : len(s.token_bonus)] += torch.tensor(s.token_bonus, dtype=torch.float32)
    return out


LOGIT_CHUNK = 256
"""Trainable positions per pass through the LM head: ``[LOGIT_CHUNK, vocab]`` logits at a time
(12.6 MB at SmolLM2's 49k vocabulary) instead of ``[B, L, vocab]`` for the whole batch."""


def response_logprobs(
    module: Any, batch: Batch, temperature: float = 1.0, chunk: int = LOGIT_CHUNK
) -> torch.Tensor:
    """``[B, T]`` logprob of each trainable response token under ``module`` (0 elsewhere: past a
    row's response and at loss-mask-0 positions, which no loss reads), from logits divided by
    ``temperature``: the distribution the engine sampled from.

    The hidden state at position ``p`` predicts token ``p + 1``, so a response starting at
    ``P`` reads positions ``P - 1 .. P + R - 2``. Only trainable positions go through the LM
    head, ``chunk`` at a time, and with gradients each chunk's logits are recomputed in the
    backward pass instead of kept (activation checkpointing): the full-vocabulary logits of a
    batch, most of an update's memory, never exist at once. Assumes a plain linear LM head
    (the Llama family; SFT makes the same assumption).
    """
    hidden = module.base_model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
    )[0]
    head = module.get_output_embeddings()
    n, span = batch.loss_mask.shape
    keep = batch.loss_mask.bool()
    rows, cols = keep.nonzero(as_tuple=True)
    starts = torch.tensor(batch.prompt_lengths, dtype=torch.long)[rows] if len(rows) else rows
    states = hidden[rows, starts + cols - 1]
    targets = batch.input_ids[rows, starts + cols]
    parts = []
    for s in range(0, len(rows), chunk):
        args = (head, states[s : s + chunk], targets[s : s + chunk], temperature)
        if torch.is_grad_enabled():
            parts.append(checkpoint(_chosen_logprobs, *args, use_reentrant=False))
        else:
            parts.append(_chosen_logprobs(*args))
    result = torch.zeros((n, span), dtype=torch.float32)
    if not parts:
        return result
    return result.index_put((rows, cols), torch.cat(parts))


def _chosen_logprobs(
    head: Any, states: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    logits = head(states).float() / temperature
    chosen = logits.gather(-1, targets[:, None]).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)
