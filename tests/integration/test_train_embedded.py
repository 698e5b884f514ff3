"""The embedded trainer end to end: rollouts through Polar's rollout server, gateway and
embedded engine, updates of the served model, versions, checkpoints, resume and metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from polar.capture.store import CaptureStore
from polar.cli.train import load_config
from polar.engines.embedded import load_model
from polar.schemas.task import TaskRequest
from polar.training.metrics import read_jsonl
from polar.training.tasks import arithmetic
from polar.training.trainer import EmbeddedTrainer
from polar.training.trainer_config import TrainConfig

pytestmark = pytest.mark.slow


# The random tiny model never adds correctly; grade something it gets right half the time.
ODD_LENGTH = "python3 -c \"import sys; sys.exit(len(open('answer.txt').read()) % 2)\""


def odd_length_tasks(
    split: str, step: int, count: int, seed: int, **options: Any
) -> list[TaskRequest]:
    """A task source (loaded by module:function) with a coin-flip reward."""
    tasks = arithmetic(split, step, count, seed, **options)  # type: ignore[arg-type]
    return [
        t.model_copy(
            update={"evaluator": t.evaluator.model_copy(update={"config": {"command": ODD_LENGTH}})}
        )
        for t in tasks
    ]


def tiny_config(out: Path, steps: int) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": "tiny",
            "steps": steps,
            "output_dir": str(out),
            "runtime": "local",
            "run_workers": 4,
            "tensorboard": True,
            "tasks": {
                "source": "integration.test_train_embedded:odd_length_tasks",
                "per_step": 2,
                "num_samples": 4,
                "timeout_s": 120,
            },
            "eval": {"tasks": 2, "num_samples": 1, "temperature": 0.0},
            "sampling": {"max_tokens": 6, "temperature": 0.7},
            "optim": {"lr": 1e-2, "micro_batch_size": 2, "minibatches": 2},
            "algorithm": {"advantage": {"std_normalize": False}, "loss": {"kl_coef": 0.01}},
            "checkpoint": {"every": 1, "keep": 2},
        }
    )


def flat(module: Any) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()]).clone()


def test_two_steps_then_resume(tmp_path: Path) -> None:
    out = tmp_path / "run"
    trainer = EmbeddedTrainer(tiny_config(out, 2), loaded=load_model("tiny"))
    assert trainer.module is trainer.core.module  # one model object, served and trained
    before = flat(trainer.module)
    summary = trainer.run()
    after = flat(trainer.module)

    # The served module itself changed, and the engine knows it: two updates, two versions.
    assert not torch.equal(before, after)
    assert trainer.core.policy_version == 2

    steps = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["sessions"] == 8 and r["statuses"] == {"COMPLETED": 8}
        assert r["traces"] == 8 and r["trainable_tokens"] > 0
        assert r["optimizer_steps"] >= 1
        assert 0.0 <= r["clip_fraction"] <= 1.0 and r["kl"] >= 0.0
        # rollouts were on-policy: the trainer's recomputation matches the engine's logprobs
        assert r["logprob_mismatch_max"] < 1e-3
        # each phase records the memory it left: resident now, the process's peak so far
        assert 0 < r["memory"]["rss_mib"] <= r["memory"]["peak_rss_mib"]
    assert steps[0]["policy_version"] == 1 and steps[1]["policy_version"] == 2
    # two minibatches per step: the second one sees moved weights, so KL and ratios move too
    assert steps[1]["kl"] > 0.0 and steps[1]["optimizer_steps"] == 2

    # Every captured completion carries the version of the weights that produced it.
    store = CaptureStore(out / "polar" / "captures.db")
    versions = {r.policy_version for sid in store.session_ids() for r in store.records(sid)}
    store.close()
    assert versions == {0, 1, 2}  # eval before (0), step 1 (0), step 2 (1), eval after (2)

    evals = read_jsonl(out / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2] and summary["evals"][-1]["sessions"] == 2
    assert (out / "reward_curve.png").stat().st_size > 1000
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert checkpoints == ["step-000001", "step-000002"]

    # Resume: a new trainer (fresh tiny weights) picks up step 2's weights and version.
    again = EmbeddedTrainer(tiny_config(out, 3), loaded=load_model("tiny"))
    again.run()
    assert again.step == 3 and again.core.policy_version == 3
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]
    assert [e["step"] for e in read_jsonl(out / "eval.jsonl")] == [0, 2, 3]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step-000002",
        "step-000003",
    ]


def test_bundled_config_loads() -> None:
    config = load_config("arithmetic")
    assert config.model == "smollm2" and config.tasks.source == "arithmetic"
    assert config.algorithm.loss.normalisation == "session"
