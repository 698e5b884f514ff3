"""verl's own agent-loop worker, run in the verl venv by test_verl_bridge.py.

``python verl_worker.py SPEC.json``: SPEC names the live rollout server (``rollout_url``; its
token comes in ``POLAR_ROLLOUT_TOKEN``), an HF model directory (config and tokenizer of the
served model), ``prompt_length``, ``response_length``, ``n``, ``prompts`` and ``out``.

What runs is verl's: its hydra defaults (``verl/trainer/config/ppo_trainer.yaml``) with the
overrides a user gives on verl's command line; the agent-loop YAML of docs/training.md, loaded
by ``AgentLoopWorker`` itself; a parquet dataset read by verl's ``create_rl_dataset`` and
``collate_fn``; the trainer's batch steps (``DataProto.from_single_dict``, a ``uid`` per prompt,
``repeat(n, interleave=True)``); ``AgentLoopWorker.generate_sequences`` (hydra instantiation of
the loop each row's ``agent_name`` names, per sample, ``_agent_loop_postprocess``, ``_postprocess`` into a
``DataProto``); the trainer's ``extract_reward`` and verl's GRPO advantage over the result.

Not run: Ray (the worker is built in this process, as verl's ``AgentLoopManager`` builds it in
an actor), verl's LLM servers (Polar's loop never calls them) and any training. The batch is
written to ``out`` with torch.save.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from polar.schemas.task import TaskRequest
from polar.training.tasks import ONE_CALL_AGENT

# A coin-flip grade the random tiny model passes about half the time, so groups have signal.
ODD_LENGTH = "python3 -c \"import sys; sys.exit(len(open('answer.txt').read()) % 2)\""


def make_task(row: dict[str, Any]) -> TaskRequest:
    """The task factory the agent-loop YAML names: verl's dataset row in, a TaskRequest out."""
    question = str(row["raw_prompt"][-1]["content"])
    return TaskRequest.model_validate(
        {
            "task_id": f"verl-{row['index']}",
            "instruction": question,
            "timeout_seconds": 120,
            "runtime": {"kind": "local", "files": {"agent.py": ONE_CALL_AGENT}},
            "agent": {
                "harness": "shell",
                "settings": {"command": "python3 agent.py {instruction}"},
            },
            "evaluator": {"strategy": "test_on_output", "config": {"command": ODD_LENGTH}},
        }
    )


# The first prompt's agent name is the YAML's (what a user writes), the second's registered.
AGENTS = ("polar", "polar_registered")

AGENT_LOOPS = """\
- name: polar
  _target_: polar.training.bridges.verl.PolarVerlAgentLoop
  rollout_url: {rollout_url}
  task_factory: verl_worker:make_task
"""


def main(spec_path: str) -> None:
    import numpy as np
    import pandas as pd
    import torch
    import verl
    from hydra import compose, initialize_config_dir
    from torch.utils.data import DataLoader
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.reward import extract_reward
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.dataset.rl_dataset import collate_fn

    from polar.training.bridges.verl import PolarAgentLoop, register_agent_loop

    spec = json.loads(Path(spec_path).read_text())
    work = Path(spec["out"]).parent
    loops = work / "agent_loops.yaml"
    loops.write_text(AGENT_LOOPS.format(rollout_url=spec["rollout_url"]))
    data = work / "train.parquet"
    pd.DataFrame(
        [
            {
                "data_source": "polar",
                "prompt": [{"role": "user", "content": prompt}],
                "agent_name": agent,
                "extra_info": {"index": i},
            }
            for i, (prompt, agent) in enumerate(zip(spec["prompts"], AGENTS, strict=True))
        ]
    ).to_parquet(data)

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={spec['model_dir']}",
                f"actor_rollout_ref.rollout.prompt_length={spec['prompt_length']}",
                f"actor_rollout_ref.rollout.response_length={spec['response_length']}",
                "actor_rollout_ref.rollout.name=vllm",
                f"actor_rollout_ref.rollout.n={spec['n']}",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
                f"data.train_files={data}",
                f"data.max_prompt_length={spec['prompt_length']}",
                f"data.max_response_length={spec['response_length']}",
                f"data.train_batch_size={len(spec['prompts'])}",
                "data.dataloader_num_workers=0",
                "algorithm.adv_estimator=grpo",
            ],
        )

    # The second agent name: a loop registered in this process by register_agent_loop.
    register_agent_loop(
        AGENTS[1],
        lambda: PolarAgentLoop(
            spec["rollout_url"],
            make_task,
            token=os.environ["POLAR_ROLLOUT_TOKEN"],
            prompt_length=spec["prompt_length"],
            response_length=spec["response_length"],
        ),
    )
    worker = AgentLoopWorker(config, llm_client=None)
    dataset = create_rl_dataset(
        config.data.train_files, config.data, worker.tokenizer, worker.processor
    )
    loader = DataLoader(dataset, batch_size=len(dataset), shuffle=False, collate_fn=collate_fn)
    batch = DataProto.from_single_dict(next(iter(loader)))
    batch.non_tensor_batch["uid"] = np.array(
        [f"prompt-{i}" for i in range(len(batch))], dtype=object
    )
    gen_batch = batch.repeat(repeat_times=config.actor_rollout_ref.rollout.n, interleave=True)
    gen_batch.meta_info["global_steps"] = 1
    output = asyncio.run(worker.generate_sequences(gen_batch))

    rewards, _ = extract_reward(output)  # what verl's trainer takes as token-level rewards
    advantages, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=rewards,
        response_mask=output.batch["response_mask"],
        index=gen_batch.non_tensor_batch["uid"],
    )
    polar = output.non_tensor_batch["polar"]
    torch.save(
        {
            "tensors": {key: value.clone() for key, value in output.batch.items()},
            "advantages": advantages,
            "uid": list(gen_batch.non_tensor_batch["uid"]),
            "session_ids": [facts["session"]["session_id"] for facts in polar],
            "num_turns": output.non_tensor_batch["__num_turns__"].tolist(),
            "agents": [str(a) for a in gen_batch.non_tensor_batch["agent_name"]],
            "row_keys": sorted(gen_batch.non_tensor_batch),  # what a loop's kwargs hold
            "pad_token_id": worker.tokenizer.pad_token_id,
        },
        spec["out"],
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(sys.argv[1])
