"""Trainer memory: peak RSS of one GRPO update on a fixed batch, full-vocabulary logits vs chunked.

Each measurement runs in a fresh process (peak RSS only grows): SmolLM2-135M (fp32) served by
an embedded engine core with the trainer's optimizer, and one ``EmbeddedTrainer._update`` over
a batch shaped like a tool_use step (16 merged three-call sessions: a ~450-token Pi prompt,
three trainable turns, two tool results between them). ``full`` computes the logits of every
position of every row at once and keeps every layer's activations (the trainer before issue
30); ``chunked`` is the trainer's own ``response_logprobs`` (trainable positions only, 256 at a
time, recomputed in backward); ``chunked+checkpointing`` adds gradient checkpointing (each
decoder layer recomputed in backward), the trainer's default now.

    python bench/trainer_memory.py                 # both, SmolLM2, prints a Markdown table
    python bench/trainer_memory.py --smoke         # tiny model, seconds (CI)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODES = ("full", "chunked", "chunked+checkpointing")


def full_logits_logprobs(module: Any, batch: Any, temperature: float = 1.0) -> Any:
    """The pre-issue-30 computation: ``[B, L, vocab]`` logits, then a slice per row."""
    import torch

    logits = module(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
    ).logits
    span = batch.loss_mask.shape[1]
    rows = []
    for i, (p, r) in enumerate(zip(batch.prompt_lengths, batch.response_lengths, strict=True)):
        step = logits[i, p - 1 : p + r - 1].float() / temperature
        targets = batch.input_ids[i, p : p + r]
        chosen = step.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(step, dim=-1)
        rows.append(torch.cat([chosen, chosen.new_zeros(span - r)]))
    return torch.stack(rows)


def measure(mode: str, model: str, sessions: int, micro: int, threads: int) -> dict[str, Any]:
    """One update in this process; returns peak RSS before and after it, and its time."""
    import torch

    from polar.engines.embedded import load_model
    from polar.schemas.trajectory import Trace
    from polar.training import trainer as trainer_module
    from polar.training.advantages import ScoredTrace
    from polar.training.losses import loss_weights
    from polar.training.trainer import EmbeddedTrainer
    from polar.training.trainer_config import TrainConfig

    torch.set_num_threads(threads)
    if mode == "full":
        trainer_module.response_logprobs = full_logits_logprobs  # type: ignore[assignment]
    loaded = load_model(model)
    config = TrainConfig.model_validate(
        {
            "model": model,
            "output_dir": "/tmp/polar-trainer-memory",
            "tensorboard": False,
            "sampling": {"temperature": 0.8},
            "optim": {
                "lr": 1e-6,
                "micro_batch_size": micro,
                "gradient_checkpointing": mode.endswith("checkpointing"),
            },
        }
    )
    trainer = EmbeddedTrainer(config, loaded=loaded)
    gen = torch.Generator().manual_seed(0)
    vocab = len(loaded.tokenizer)
    prompt = torch.randint(0, vocab, (450,), generator=gen).tolist()
    scored = []
    for i in range(sessions):
        turns = [35, 40, 8]  # two bash calls and a closing message
        tools = [60, 40]  # tool results and template glue between them
        response, mask = [], []
        for k, n in enumerate(turns):
            response += torch.randint(0, vocab, (n,), generator=gen).tolist()
            mask += [1] * n
            if k < len(tools):
                response += torch.randint(0, vocab, (tools[k],), generator=gen).tolist()
                mask += [0] * tools[k]
        lps = [-1.0 if m else 0.0 for m in mask]
        trace = Trace(
            prompt_ids=prompt, response_ids=response, loss_mask=mask, response_logprobs=lps
        )
        scored.append(ScoredTrace(trace, f"s{i}", f"g{i // 4}", 1.0 if i % 2 else -1.0, 0.0))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    trainer._update(scored, loss_weights(scored, "session"))
    seconds = time.perf_counter() - started
    trainer.core.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "mode": mode,
        "model": model,
        "sessions": sessions,
        "micro_batch_size": micro,
        "rss_before_update_mb": round(before),
        "peak_rss_mb": round(peak),
        "update_growth_mb": round(peak - before),
        "update_s": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--out", type=Path, default=Path("bench-results/trainer-memory.json"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads per measurement")
    parser.add_argument("--smoke", action="store_true", help="tiny model, 4 sessions")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.model, args.sessions = "tiny", 4
    if args.child:
        measured = measure(
            args.child, args.model, args.sessions, args.micro_batch_size, args.threads
        )
        print(json.dumps(measured))
        return
    rows = []
    for mode in args.modes:
        argv = [sys.executable, __file__, "--child", mode, "--model", args.model]
        argv += ["--sessions", str(args.sessions), "--micro-batch-size", str(args.micro_batch_size)]
        argv += ["--threads", str(args.threads)]
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    print("| logprobs | peak RSS (MB) | before the update (MB) | update adds (MB) | update (s) |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['mode']} | {r['peak_rss_mb']} | {r['rss_before_update_mb']} "
            f"| {r['update_growth_mb']} | {r['update_s']} |"
        )


if __name__ == "__main__":
    main()
