"""The GRPO update checked against references on one fixed batch (issue 30, item 0).

A tiny random Llama with SmolLM2's real tokenizer and chat template; traces shaped like merged
multi-call sessions (loss-mask-0 interstitials between trainable turns), sampled at T=0.8.
Our pipeline (advantages, loss weights, padded batch, chunked response logprobs, clipped loss)
must give the same loss and the same gradient as a textbook GRPO written out per sequence from
the full logits, and as TRL's own ``GRPOTrainer._compute_loss``; and one update by the trainer
must raise the likelihood of positively rewarded sequences and lower that of negative ones.
"""

from __future__ import annotations

import types
from collections import defaultdict
from typing import Any

import pytest
import torch

from polar.engines.embedded import load_model
from polar.schemas.trajectory import Trace
from polar.training.advantages import ScoredTrace, SessionSample, compute_advantages
from polar.training.batch import make_batch, response_logprobs
from polar.training.config import AdvantageConfig
from polar.training.losses import clipped_policy_loss, loss_weights
from polar.training.trainer import EmbeddedTrainer
from polar.training.trainer_config import TrainConfig

T = 0.8
REWARDS = {"g0": [1.0, 0.0, 0.0, 1.0], "g1": [1.0, 0.0, 0.0, 0.0], "g2": [1.0, 1.0, 1.0, 1.0]}


@pytest.fixture(scope="module")
def loaded() -> Any:
    return load_model("tiny")


def _samples(loaded: Any, seed: int = 0) -> list[SessionSample]:
    """Three groups of four sessions (one flat); each trace: a chat prompt, then turn,
    interstitial (mask 0), turn; behaviour logprobs a little off the model's own."""
    gen = torch.Generator().manual_seed(seed)
    tok = loaded.tokenizer
    vocab = len(tok)
    samples = []
    for g, rewards in REWARDS.items():
        text = tok.apply_chat_template(
            [{"role": "user", "content": f"Create a file for group {g}."}],
            add_generation_prompt=True,
            tokenize=False,
        )
        prompt = list(tok(text, add_special_tokens=False)["input_ids"])
        for i, reward in enumerate(rewards):
            a, b, c = (int(x) for x in torch.randint(2, 9, (3,), generator=gen))
            response = torch.randint(0, vocab, (a + b + c,), generator=gen).tolist()
            mask = [1] * a + [0] * b + [1] * c
            noise = (torch.rand(a + b + c, generator=gen) * -3.0).tolist()
            logprobs = [x if m else 0.0 for x, m in zip(noise, mask, strict=True)]
            trace = Trace(
                prompt_ids=prompt,
                response_ids=response,
                loss_mask=mask,
                response_logprobs=logprobs,
            )
            samples.append(SessionSample(f"{g}-{i}", g, "COMPLETED", reward, (trace,)))
    return samples


def _reference_loss(
    module: Any, samples: list[SessionSample], behaviour: list[torch.Tensor], mode: str
) -> torch.Tensor:
    """GRPO written out per sequence: full logits / T, group advantages with the unbiased std,
    the clipped surrogate; ``token`` = mean over all trainable tokens (TRL's ``bnpo``),
    ``trace`` = mean over sequences of each one's token mean (TRL's ``grpo``)."""
    by_group: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        assert s.reward is not None
        by_group[s.group_id].append(s.reward)
    sums, counts = [], []
    for s, old in zip(samples, behaviour, strict=True):
        rewards = torch.tensor(by_group[s.group_id])
        assert s.reward is not None
        adv = float((s.reward - rewards.mean()) / (rewards.std() + 1e-6))
        trace = s.traces[0]
        ids = torch.tensor([trace.prompt_ids + trace.response_ids])
        logits = module(input_ids=ids).logits[0].float() / T
        p = len(trace.prompt_ids)
        logp = torch.log_softmax(logits[p - 1 : -1], dim=-1)
        logp = logp.gather(-1, ids[0, p:, None]).squeeze(-1)
        mask = torch.tensor(trace.loss_mask, dtype=torch.bool)
        ratio = torch.exp(logp[mask] - old[mask])
        per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)
        sums.append(per_token.sum())
        counts.append(int(mask.sum()))
    if mode == "token":
        return torch.stack(sums).sum() / sum(counts)
    return torch.stack([s / n for s, n in zip(sums, counts, strict=True)]).mean()


def _ours(module: Any, samples: list[SessionSample], mode: str) -> torch.Tensor:
    scored, _ = compute_advantages(samples, AdvantageConfig(std_normalize=True))
    weights = loss_weights(scored, mode)  # type: ignore[arg-type]
    batch = make_batch(scored, weights, pad_id=0)
    logp = response_logprobs(module, batch, T, chunk=7)  # several chunks per batch
    return clipped_policy_loss(
        logp, batch.rollout_logprobs, batch.advantages, batch.weights, batch.loss_mask
    ).loss


def _grads(module: Any, loss: torch.Tensor) -> list[torch.Tensor]:
    module.zero_grad(set_to_none=True)
    loss.backward()
    grads = [p.grad.clone() for p in module.parameters() if p.grad is not None]
    module.zero_grad(set_to_none=True)
    return grads


def _behaviour(samples: list[SessionSample]) -> list[torch.Tensor]:
    return [torch.tensor(s.traces[0].response_logprobs) for s in samples]


@pytest.mark.parametrize("mode", ["token", "trace"])
def test_loss_and_gradient_match_a_per_sequence_reference(loaded: Any, mode: str) -> None:
    module = loaded.module
    samples = _samples(loaded)
    ours = _ours(module, samples, mode)
    ref = _reference_loss(module, samples, _behaviour(samples), mode)
    assert float(ours.detach()) == pytest.approx(float(ref.detach()), rel=1e-4, abs=1e-6)
    got, want = _grads(module, ours), _grads(module, ref)
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize(("mode", "loss_type"), [("token", "bnpo"), ("trace", "grpo")])
def test_loss_matches_trl(loaded: Any, mode: str, loss_type: str) -> None:
    """TRL's GRPOTrainer._compute_loss on the same per-token logprobs, advantages and masks."""
    grpo = pytest.importorskip("trl.trainer.grpo_trainer")
    module = loaded.module
    samples = _samples(loaded)
    scored, _ = compute_advantages(samples, AdvantageConfig(std_normalize=True))
    batch = make_batch(scored, [1.0] * len(scored), pad_id=0)
    with torch.no_grad():
        logp = response_logprobs(module, batch, T)
    stub = types.SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=0.0,
        loss_type=loss_type,
        epsilon_low=0.2,
        epsilon_high=0.2,
        args=types.SimpleNamespace(delta=None),
        use_vllm=False,
        model=types.SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list)},
        accelerator=types.SimpleNamespace(gather=lambda x: x, reduce=lambda x, **k: x),
    )
    span = batch.loss_mask.shape[1]
    inputs = {
        "prompt_ids": torch.zeros((len(scored), 1), dtype=torch.long),
        "prompt_mask": torch.ones((len(scored), 1), dtype=torch.long),
        "completion_ids": torch.zeros((len(scored), span), dtype=torch.long),
        "completion_mask": batch.loss_mask,
        "advantages": batch.advantages,
        "old_per_token_logps": torch.nan_to_num(batch.rollout_logprobs, nan=0.0),
    }
    trl_loss = grpo.GRPOTrainer._compute_loss(stub, None, inputs)
    ours = clipped_policy_loss(
        logp,
        batch.rollout_logprobs,
        batch.advantages,
        torch.tensor(loss_weights(scored, mode)),  # type: ignore[arg-type]
        batch.loss_mask,
    ).loss
    # TRL's grpo averages over every row, ours over rows with trainable tokens: all have some
    assert float(ours) == pytest.approx(float(trl_loss), rel=1e-5)


def _sequence_logprobs(module: Any, scored: list[ScoredTrace]) -> list[float]:
    batch = make_batch(scored, [1.0] * len(scored), pad_id=0)
    with torch.no_grad():
        logp = response_logprobs(module, batch, T)
    return (logp * batch.loss_mask).sum(dim=1).tolist()


def test_one_trainer_update_moves_positives_up_and_negatives_down(tmp_path: Any) -> None:
    """EmbeddedTrainer._update (two passes, as the tool_use recipe) on on-policy traces."""
    loaded = load_model("tiny")
    config = TrainConfig.model_validate(
        {
            "model": "tiny",
            "output_dir": str(tmp_path),
            "tensorboard": False,
            "sampling": {"temperature": T},
            "optim": {"lr": 1e-3, "epochs": 2, "micro_batch_size": 4},
            "algorithm": {"loss": {"normalisation": "session"}},
        }
    )
    trainer = EmbeddedTrainer(config, loaded=loaded)
    try:
        samples = _samples(loaded)
        scored, report = compute_advantages(samples, config.algorithm.advantage)
        assert report.flat_groups == 1
        before = _sequence_logprobs(trainer.module, scored)
        # on-policy: the behaviour logprobs are the model's own at the sampling temperature
        batch = make_batch(scored, [1.0] * len(scored), pad_id=0)
        with torch.no_grad():
            own = response_logprobs(trainer.module, batch, T)
        scored = [
            ScoredTrace(
                s.trace.model_copy(
                    update={"response_logprobs": own[i, : len(s.trace.response_ids)].tolist()}
                ),
                s.session_id,
                s.group_id,
                s.advantage,
                s.reward,
            )
            for i, s in enumerate(scored)
        ]
        update = trainer._update(scored, loss_weights(scored, "session"))
        after = _sequence_logprobs(trainer.module, scored)
    finally:
        trainer.core.close()
    assert update["optimizer_steps"] == 2
    assert not trainer.module.training  # served in eval mode again after the checkpointed update
    assert update["logprob_mismatch_max"] < 1e-4
    moved = [(s.advantage, a - b) for s, a, b in zip(scored, after, before, strict=True)]
    positive = [d for adv, d in moved if adv > 0]
    negative = [d for adv, d in moved if adv < 0]
    assert len(positive) == 3 and len(negative) == 5
    assert all(d > 0 for d in positive), moved
    assert all(d < 0 for d in negative), moved
