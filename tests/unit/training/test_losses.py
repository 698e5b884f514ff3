"""The clipped policy-gradient loss and the loss normalisation, against hand computations."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.schemas.trajectory import Trace
from polar.training.advantages import ScoredTrace
from polar.training.losses import clipped_policy_loss, loss_weights


def scored(session: str, mask: list[int]) -> ScoredTrace:
    trace = Trace(prompt_ids=[1], response_ids=list(range(len(mask))), loss_mask=mask)
    return ScoredTrace(trace, session, "g", 1.0, 1.0)


def test_loss_matches_a_hand_computation() -> None:
    # one row, three tokens; the third is masked and holds junk
    logp = torch.tensor([[math.log(0.5), math.log(0.3), float("nan")]], requires_grad=True)
    old = torch.tensor([[math.log(0.25), math.log(0.3), 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    out = clipped_policy_loss(
        logp, old, torch.tensor([2.0]), torch.tensor([0.5]), mask, clip_low=0.2, clip_high=0.2
    )
    # token 1: ratio 2 -> clipped to 1.2 (A > 0), pg = -2.4; token 2: ratio 1, pg = -2
    assert out.loss.item() == pytest.approx(0.5 * (-2.4) + 0.5 * (-2.0))
    assert out.clip_fraction == pytest.approx(0.5)
    assert out.ratio_mean == pytest.approx(1.5)
    assert out.tokens == 2
    out.loss.backward()
    grad = logp.grad
    assert grad is not None
    # clipped token has no gradient; d/dlogp of -ratio*A*w at ratio 1 is -A*w = -1
    assert grad[0, 0].item() == 0.0
    assert grad[0, 1].item() == pytest.approx(-1.0)
    assert grad[0, 2].item() == 0.0 and not torch.isnan(grad).any()


def test_negative_advantage_clips_below() -> None:
    logp = torch.tensor([[math.log(0.1)]], requires_grad=True)
    old = torch.tensor([[math.log(0.2)]])  # ratio 0.5 < 0.8
    out = clipped_policy_loss(
        logp, old, torch.tensor([-1.0]), torch.tensor([1.0]), torch.ones(1, 1)
    )
    # -min(0.5 * -1, 0.8 * -1) = 0.8
    assert out.loss.item() == pytest.approx(0.8)
    assert out.clip_fraction == 1.0


def test_kl_penalty_k3() -> None:
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25)]])
    out = clipped_policy_loss(
        logp,
        logp.detach(),
        torch.tensor([0.0]),
        torch.tensor([1.0]),
        torch.ones(1, 1),
        ref_logprobs=ref,
        kl_coef=0.1,
    )
    d = math.log(0.25) - math.log(0.5)
    k3 = math.exp(d) - d - 1
    assert out.kl == pytest.approx(k3)
    assert out.loss.item() == pytest.approx(0.1 * k3)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_masked_tokens_contribute_nothing(rows: int, cols: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(rows, cols, generator=gen)
    old = -torch.rand(rows, cols, generator=gen)
    adv = torch.randn(rows, generator=gen)
    w = torch.rand(rows, generator=gen)
    mask = (torch.rand(rows, cols, generator=gen) > 0.5).int()
    base = clipped_policy_loss(logp, old, adv, w, mask).loss.item()
    # change every masked position arbitrarily: the loss must not move
    junk = torch.where(mask.bool(), logp, torch.full_like(logp, 123.0))
    assert clipped_policy_loss(junk, old, adv, w, mask).loss.item() == pytest.approx(base)


def test_on_policy_gradient_is_the_reinforce_gradient() -> None:
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    adv = torch.tensor([1.5, -0.5])
    w = torch.tensor([0.25, 0.25])
    clipped_policy_loss(logp, logp.detach(), adv, w, torch.ones(2, 2)).loss.backward()
    assert logp.grad is not None
    assert torch.allclose(logp.grad, -(adv * w)[:, None].expand(2, 2))


@pytest.mark.parametrize("mode", ["token", "trace", "session"])
def test_weights_sum_to_one(mode: str) -> None:
    batch = [scored("a", [1, 1, 0, 1]), scored("a", [1]), scored("b", [1, 1]), scored("c", [0])]
    w = loss_weights(batch, mode)  # type: ignore[arg-type]
    assert sum(wi * s.trainable_tokens for wi, s in zip(w, batch, strict=True)) == pytest.approx(
        1.0
    )
    assert w[3] == 0.0  # no trainable token, no weight


def test_weight_modes_by_hand() -> None:
    batch = [scored("a", [1, 1, 1]), scored("a", [1]), scored("b", [1, 1])]
    assert loss_weights(batch, "token") == pytest.approx([1 / 6, 1 / 6, 1 / 6])
    assert loss_weights(batch, "trace") == pytest.approx([1 / 9, 1 / 3, 1 / 6])
    # session a has 4 tokens, b has 2; each session totals 1/2
    assert loss_weights(batch, "session") == pytest.approx([1 / 8, 1 / 8, 1 / 4])


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abcd"), st.lists(st.integers(0, 1), min_size=1, max_size=8)),
        min_size=1,
        max_size=10,
    )
)
def test_session_weights_sum_to_one_per_session(items: list[tuple[str, list[int]]]) -> None:
    batch = [scored(sid, mask) for sid, mask in items]
    w = loss_weights(batch, "session")
    totals: dict[str, float] = {}
    for wi, s in zip(w, batch, strict=True):
        totals[s.session_id] = totals.get(s.session_id, 0.0) + wi * s.trainable_tokens
    live = [sid for sid in totals if any(s.trainable_tokens for s in batch if s.session_id == sid)]
    for sid in live:
        assert totals[sid] * len(live) == pytest.approx(1.0)
