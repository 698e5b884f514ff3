"""The token-level clipped policy-gradient loss, and how tokens are weighted into it.

The behaviour policy is the one that sampled the tokens: the engine's logprobs recorded with each
trace. Per trainable token t (loss mask 1) with advantage A::

    ratio = exp(logp_t - behaviour_t)
    pg    = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)
    kl    = exp(ref_t - logp_t) - (ref_t - logp_t) - 1        (k3 estimator, when a reference is given)
    loss  = sum_t weight_t * (pg + kl_coef * kl)

The weights carry the normalisation (:func:`loss_weights`) and sum to 1 over the batch, so the
loss is a weighted mean whatever the mode and microbatches simply add up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from polar.training.advantages import ScoredTrace
from polar.training.config import Normalisation


@dataclass
class LossTerms:
    """The differentiable loss and what to log about it (the floats are over masked tokens)."""

    loss: torch.Tensor
    pg_loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float
    tokens: int


def loss_weights(scored: Sequence[ScoredTrace], mode: Normalisation) -> list[float]:
    """Per trace, the weight each of its trainable tokens gets; all tokens' weights sum to 1.

    ``token``: every trainable token in the batch the same. ``trace``: every trace with at least
    one trainable token the same total. ``session``: every session the same total, shared
    over its traces' tokens, so a session that yielded three traces weighs as one.
    """
    counts = [s.trainable_tokens for s in scored]
    if mode == "token":
        total = sum(counts)
        return [1.0 / total if total and n else 0.0 for n in counts]
    if mode == "trace":
        traces = sum(1 for n in counts if n)
        return [1.0 / (traces * n) if n else 0.0 for n in counts]
    per_session: Counter[str] = Counter()
    for s, n in zip(scored, counts, strict=True):
        per_session[s.session_id] += n
    sessions = sum(1 for n in per_session.values() if n)
    return [
        1.0 / (sessions * per_session[s.session_id]) if n else 0.0
        for s, n in zip(scored, counts, strict=True)
    ]


def clipped_policy_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> LossTerms:
    """The loss over a padded batch ``[B, T]``; ``advantages`` and ``weights`` are ``[B]`` or
    ``[B, T]``. Masked positions contribute nothing, whatever their values (even inf or nan)."""
    keep = mask.to(torch.bool)
    adv = _per_token(advantages, logprobs)
    w = _per_token(weights, logprobs)
    # Masked positions may hold padding junk; zero them before exp so no nan leaks into grads.
    delta = torch.where(keep, logprobs - behaviour_logprobs, torch.zeros_like(logprobs))
    ratio = torch.exp(delta)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    pg = -torch.minimum(unclipped, clipped)
    per_token = pg
    kl = torch.zeros_like(logprobs)
    if ref_logprobs is not None:
        d = torch.where(keep, ref_logprobs - logprobs, torch.zeros_like(logprobs))
        kl = torch.exp(d) - d - 1.0
        per_token = pg + kl_coef * kl
    zero = torch.zeros_like(per_token)
    loss = torch.where(keep, per_token * w, zero).sum()
    tokens = int(keep.sum())
    with torch.no_grad():
        denom = max(tokens, 1)
        was_clipped = keep & (clipped < unclipped)
        return LossTerms(
            loss=loss,
            pg_loss=float(torch.where(keep, pg * w, zero).sum()),
            kl=float(torch.where(keep, kl, zero).sum() / denom),
            clip_fraction=float(was_clipped.sum() / denom),
            ratio_mean=float(torch.where(keep, ratio, zero).sum() / denom) if tokens else 1.0,
            tokens=tokens,
        )


def _per_token(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    values = values.to(like.dtype)
    return values[:, None].expand_as(like) if values.dim() == 1 else values
