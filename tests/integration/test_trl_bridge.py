"""Two real TRL GRPOTrainer steps whose rollouts run through Polar: rollout server, gateway
node, one-call agent processes and the embedded engine serving the very model TRL trains."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from polar.capture.store import CaptureStore
from polar.engines.embedded import EmbeddedEngineCore, load_model
from polar.gateway.config import SamplingPolicy
from polar.schemas.task import TaskRequest
from polar.stack.local import LocalStack
from polar.training.bridges.trl import PolarRolloutFunc, polar_reward, task_from_template
from polar.training.tasks import ONE_CALL_AGENT

pytestmark = pytest.mark.slow
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

# A coin-flip grade the random tiny model passes about half the time, so groups have signal.
ODD_LENGTH = "python3 -c \"import sys; sys.exit(len(open('answer.txt').read()) % 2)\""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[EmbeddedEngineCore, LocalStack]]:
    core = EmbeddedEngineCore(load_model("tiny"))
    stack = LocalStack.embedded(
        core, tmp_path / "polar", sampling=SamplingPolicy(max_tokens=6), runtime="local"
    ).start()
    yield core, stack
    stack.stop()
    core.close()


def template() -> TaskRequest:
    return TaskRequest.model_validate(
        {
            "task_id": "trl",
            "instruction": "",
            "timeout_seconds": 120,
            "runtime": {"kind": "local", "files": {"agent.py": ONE_CALL_AGENT}},
            "agent": {
                "harness": "shell",
                "settings": {"command": "python3 agent.py {instruction}"},
            },
            "evaluator": {"strategy": "test_on_output", "config": {"command": ODD_LENGTH}},
        }
    )


GROUP = 8


def flat(module: Any) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()]).clone()


def test_two_grpo_steps_through_polar(
    served: tuple[EmbeddedEngineCore, LocalStack], tmp_path: Path
) -> None:
    core, stack = served
    func = PolarRolloutFunc(
        stack.rollout_url,
        task_from_template(template()),
        token=stack.rollout_token,
        on_new_weights=lambda step: core.bump_policy_version(),
    )
    calls: list[dict[str, list[Any]]] = []

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        out = func(prompts, trainer)
        calls.append(out)
        return out

    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        # Groups of 8: the coin-flip grade gives a group no signal (all sessions alike) with
        # probability 1/128, and two flat steps in a row (nothing to train on) 1/16384; with
        # groups of 4 that was 1/64, and CI met it.
        per_device_train_batch_size=GROUP,
        num_generations=GROUP,
        max_steps=2,
        learning_rate=5e-3,
        beta=0.0,
        max_completion_length=16,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
        gradient_checkpointing=False,  # the engine serving this module needs its KV cache
        bf16=False,  # and keeps the dtype it was loaded with
    )
    dataset = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}]} for i in range(8)]
    )
    trainer = trl.GRPOTrainer(
        model=core.module,
        reward_funcs=polar_reward,
        args=args,
        train_dataset=dataset,
        processing_class=core.tokenizer,
        rollout_func=rollout,
    )
    before = flat(core.module)
    trainer.train()

    assert trainer.state.global_step == 2
    assert not torch.equal(before, flat(core.module))  # TRL trained the served module in place
    assert core.policy_version == 1  # the engine was told once, between the two rollouts
    assert len(calls) == 2
    for out in calls:
        assert len(out["prompt_ids"]) == GROUP  # one group of num_generations sessions
        assert all(r in (0.0, 1.0) for r in out["reward"])
    # TRL trained on exactly the tokens the engine sampled, with the engine's logprobs.
    store = CaptureStore(stack.work_dir / "captures.db")
    try:
        for row, completion, mask, logprobs in zip(
            func.last_rows,
            calls[-1]["completion_ids"],
            calls[-1]["env_mask"],
            calls[-1]["logprobs"],
            strict=True,
        ):
            [record] = store.records(row.result.session_id)
            assert record.policy_version == 1
            assert [t for t, m in zip(completion, mask, strict=True) if m] == record.sampled_ids
            assert logprobs == pytest.approx(record.logprobs)
    finally:
        store.close()
