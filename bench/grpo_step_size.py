"""How far one GRPO update moves SmolLM2 on sequences it was not trained on (issue 30, item 0).

From the base weights each time: one ``EmbeddedTrainer._update`` (the trainer's own optimizer
and loss) on 16 tool-call sequences of the tool_use chores, as a step of the recipe sees them
after its first: one group with rewards 1, 1, 1, 0 (three correct bash calls, one reply in
prose) and three flat groups. Reported per setting: the KL per token between the next-token
distributions (at T = 0.8) before and after, on 16 other chores' correct tool calls, and the
change of those sequences' log-likelihood.

    python bench/grpo_step_size.py                 # SmolLM2: 2e-5 x 2 passes, 2e-6, 1e-6
    python bench/grpo_step_size.py --smoke         # tiny model, one setting (seconds)
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from typing import Any

import torch

from polar.engines.embedded import load_model
from polar.harnesses.pi import COMPACT_SETTINGS
from polar.schemas.trajectory import Trace
from polar.training.advantages import ScoredTrace
from polar.training.batch import make_batch
from polar.training.losses import loss_weights
from polar.training.tool_use import Chore, chores
from polar.training.trainer import EmbeddedTrainer
from polar.training.trainer_config import TrainConfig

T = 0.8
SETTINGS = ((2e-5, 2), (2e-6, 1), (1e-6, 1))


def sequence(tokenizer: Any, chore: Chore, good: bool) -> Trace:
    """The chore's prompt, then its first solution command as a tool call (or prose)."""
    system = COMPACT_SETTINGS["extra_args"][1]
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": chore.instruction},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    call = json.dumps({"name": "bash", "arguments": {"command": chore.solution[0]}})
    reply = (
        f"<tool_call>\n{call}\n</tool_call><|im_end|>"
        if good
        else "Sure! Here is how you can do it in Python.<|im_end|>"
    )
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    response = tokenizer(reply, add_special_tokens=False)["input_ids"]
    return Trace(prompt_ids=prompt, response_ids=response, loss_mask=[1] * len(response))


def next_token_logprobs(module: Any, traces: list[Trace]) -> list[torch.Tensor]:
    batch = make_batch([ScoredTrace(t, "s", "g", 0.0, 0.0) for t in traces], [1.0] * len(traces))
    with torch.no_grad():
        hidden = module.base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)[
            0
        ]
        head = module.get_output_embeddings()
        return [
            torch.log_softmax(head(hidden[i, p - 1 : p + r - 1]).float() / T, dim=-1)
            for i, (p, r) in enumerate(
                zip(batch.prompt_lengths, batch.response_lengths, strict=True)
            )
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="tiny model, the first setting")
    args = parser.parse_args()
    settings = SETTINGS[:1] if args.smoke else SETTINGS
    model = "tiny" if args.smoke else args.model
    torch.set_num_threads(args.threads)
    loaded = load_model(model)
    weights = copy.deepcopy(loaded.module.state_dict())
    every = list(chores())
    train, held = every[0:200:12][:16], every[5:200:11][:16]
    held_out = [sequence(loaded.tokenizer, c, True) for c in held]
    print(
        "| lr | passes | KL per held-out token, mean (max) | held-out log-lik. change | clipped | s |"
    )
    print("|---|---|---|---|---|---|")
    for lr, epochs in settings:
        loaded.module.load_state_dict(weights)
        config = TrainConfig.model_validate(
            {
                "model": model,
                "output_dir": "/tmp/polar-grpo-step-size",
                "tensorboard": False,
                "sampling": {"temperature": T},
                "optim": {"lr": lr, "epochs": epochs, "micro_batch_size": 4},
            }
        )
        trainer = EmbeddedTrainer(config, loaded=loaded)
        scored = []
        for i, chore in enumerate(train):
            good = i != 3  # group g0: three right, one prose; g1-g3 flat (all right)
            advantage = (0.5 if good else -1.5) if i < 4 else 0.0
            trace = sequence(loaded.tokenizer, chore, good)
            scored.append(ScoredTrace(trace, f"s{i}", f"g{i // 4}", advantage, float(good)))
        before = next_token_logprobs(trainer.module, held_out)
        started = time.perf_counter()
        update = trainer._update(scored, loss_weights(scored, "session"))
        seconds = time.perf_counter() - started
        after = next_token_logprobs(trainer.module, held_out)
        trainer.core.close()
        kl = torch.cat([(b.exp() * (b - a)).sum(-1) for b, a in zip(before, after, strict=True)])
        moved = [
            float((a - b).gather(-1, torch.tensor(t.response_ids)[:, None]).sum())
            for t, b, a in zip(held_out, before, after, strict=True)
        ]
        print(
            f"| {lr:g} | {epochs} | {kl.mean():.4f} ({kl.max():.3f}) | "
            f"{sum(moved) / len(moved):+.2f} nats | {update['clip_fraction']:.2f} | {seconds:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
