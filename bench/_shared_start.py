"""What the benches that run GRPO arms from one warm start share (turn_credit,
builder_ablation, grpo_only): the tool_use recipe at a bench's sizes, one warm start per seed whose
checkpoint seeds every arm, and an arm run from it in a process of its own (its peak memory
is then its own)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from polar.cli.train import load_config
from polar.training.trainer import EmbeddedTrainer
from polar.training.trainer_config import TrainConfig


def recipe(
    model: str,
    seed: int,
    *,
    steps: int,
    per_step: int,
    samples: int,
    eval_tasks: int,
    sft_tasks: int,
    threads: int,
    sft_epochs: int | None = None,
    options: dict[str, Any] | None = None,
) -> TrainConfig:
    """The bundled tool_use recipe with these sizes and task-source ``options`` over its own
    (``sft_epochs`` None: the recipe's)."""
    base = load_config("tool_use")
    merged = {**base.tasks.options, **(options or {})}
    return base.model_copy(
        update={
            "model": model,
            "seed": seed,
            "steps": steps,
            "threads": threads,
            "tensorboard": False,
            "tasks": base.tasks.model_copy(
                update={"options": merged, "per_step": per_step, "num_samples": samples}
            ),
            "eval": base.eval.model_copy(update={"tasks": eval_tasks, "every": 0}),
            "sft": base.sft.model_copy(
                update={"tasks": sft_tasks, "epochs": sft_epochs or base.sft.epochs}
            ),
        }
    )


def add_sizes(parser: argparse.ArgumentParser, *, sft_tasks: int = 16) -> None:
    """The run sizes every such bench takes, with the same defaults (``recipe_from`` reads them)."""
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps per arm")
    parser.add_argument("--per-step", type=int, default=3, help="chores (groups) per step")
    parser.add_argument("--samples", type=int, default=4, help="sessions per chore")
    parser.add_argument("--eval-tasks", type=int, default=6, help="held-out chores (x2 samples)")
    parser.add_argument("--sft-tasks", type=int, default=sft_tasks, help="demonstrated chores")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per arm")


def smoke_sizes(args: argparse.Namespace, name: str) -> str:
    """With ``--smoke``: every such bench's CI sizes (the tiny model, one seed, one step of one
    group of 2, one held-out chore, 2 demonstrations, one warm-start epoch where the bench
    has the option) and a fresh output folder. Returns the model to run."""
    if not args.smoke:
        return "smollm2"
    args.seeds, args.steps, args.per_step, args.samples = [0], 1, 1, 2
    args.eval_tasks, args.sft_tasks = 1, 2
    if hasattr(args, "sft_epochs"):
        args.sft_epochs = 1
    args.out = tempfile.mkdtemp(prefix=f"polar-bench-{name}-")
    return "tiny"


def recipe_from(
    args: argparse.Namespace, model: str, seed: int, options: dict[str, Any]
) -> TrainConfig:
    """``recipe`` at the sizes a bench's command line names (``--steps``, ``--per-step``,
    ``--samples``, ``--eval-tasks``, ``--sft-tasks``, ``--threads``, ``--sft-epochs`` if it has
    one)."""
    return recipe(
        model,
        seed,
        steps=args.steps,
        per_step=args.per_step,
        samples=args.samples,
        eval_tasks=args.eval_tasks,
        sft_tasks=args.sft_tasks,
        threads=args.threads,
        sft_epochs=getattr(args, "sft_epochs", None),
        options=options,
    )


def warm_start(base: TrainConfig, warm_dir: Path) -> None:
    """Demonstrations and SFT only (no evaluation, no GRPO step); its checkpoint seeds arms."""
    no_eval = base.eval.model_copy(update={"tasks": 0})
    warm = base.model_copy(update={"steps": 0, "output_dir": warm_dir, "eval": no_eval})
    run_measured(warm, resume=False)


def run_arm(cfg: TrainConfig, warm_dir: Path, arm_dir: Path) -> None:
    """GRPO from the warm start's checkpoint (no second warm start), evaluated before and
    after, in this process."""
    shutil.rmtree(arm_dir, ignore_errors=True)
    shutil.copytree(warm_dir / "checkpoints", arm_dir / "checkpoints")
    arm = cfg.model_copy(
        update={"output_dir": arm_dir, "sft": cfg.sft.model_copy(update={"tasks": 0})}
    )
    run_measured(arm, resume=True)


def run_arms_apart(jobs: list[tuple[TrainConfig, Path, Path]], *, together: bool) -> None:
    """``run_arm`` for each job in a fresh process: one after another, or all at once. A stop
    of this process (Ctrl-C, SIGTERM) stops the arms too."""
    spawn = multiprocessing.get_context("spawn")
    procs = [spawn.Process(target=run_arm, args=job) for job in jobs]
    previous = signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        for proc in procs:
            proc.start()
            if not together:
                _joined(proc)
        for proc in procs:
            _joined(proc)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(30)


def _exit_on_term(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def _joined(proc: Any) -> None:
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"an arm's process failed (exit code {proc.exitcode})")


def run_measured(cfg: TrainConfig, *, resume: bool) -> None:
    """Train, then write ``wall_s.json`` (seconds, and this process's peak RSS in MiB)."""
    started = time.perf_counter()
    EmbeddedTrainer(cfg, echo=print).run(resume=resume)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10  # KiB on Linux
    record = {"wall_s": round(time.perf_counter() - started, 1), "peak_rss_mib": peak_mib}
    (cfg.output_dir / "wall_s.json").write_text(json.dumps(record))


def wall(out: Path) -> dict[str, Any]:
    return json.loads((out / "wall_s.json").read_text())


def fmt(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
