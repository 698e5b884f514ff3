"""Learning benchmark: does GRPO through Polar make SmolLM2-135M better at a toy task on CPU?

Each run trains the embedded trainer (rollout server, gateway, one-call agent processes,
embedded engine, all sharing one model) from the same starting weights with a different seed,
evaluating the same held-out tasks before and after. The question is whether the held-out
pass rate rises by more than the noise: the spread of the same measurement between runs
(seeds), before and after, and the binomial standard error of one evaluation.

    python bench/learning.py                          # 2 runs of the bundled config
    python bench/learning.py --runs 3 --steps 20 --out bench-results/learning
    python bench/learning.py --quick                  # tiny model, plumbing only
    python bench/learning.py --smoke                  # the same, smaller: what CI runs
    python bench/learning.py --runs 3 --report-only   # re-summarise finished runs

Writes ``<out>/summary.json``, every run's metrics and reward curve under ``<out>/seed-N/``,
and prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from polar.cli.train import load_config
from polar.training.metrics import pyplot, read_jsonl
from polar.training.trainer import EmbeddedTrainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="arithmetic", help="bundled name or YAML path")
    parser.add_argument("--runs", type=int, default=2, help="training runs (seeds 0..N-1)")
    parser.add_argument("--seeds", type=int, nargs="+", help="exactly these seeds instead")
    parser.add_argument(
        "--resume", action="store_true", help="continue runs from their last checkpoint"
    )
    parser.add_argument("--steps", type=int, help="override steps")
    parser.add_argument("--eval-tasks", type=int, help="override eval.tasks")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--out", default="bench-results/learning")
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 steps (plumbing)")
    parser.add_argument(
        "--smoke", action="store_true", help="one run, tiny model, 1 step, 2 eval tasks (CI)"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="summarise the runs already in --out"
    )
    args = parser.parse_args()
    if args.smoke:
        args.quick, args.runs, args.seeds, args.eval_tasks = True, 1, None, 2
        args.out = tempfile.mkdtemp(prefix="polar-bench-learning-")

    torch.set_num_threads(args.threads)
    base = load_config(args.config)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for seed in args.seeds if args.seeds is not None else range(args.runs):
        update: dict[str, Any] = {
            "seed": seed,
            "output_dir": out / f"seed-{seed}",
            "threads": args.threads,
        }
        if args.steps is not None:
            update["steps"] = args.steps
        if args.eval_tasks is not None:
            update["eval"] = base.eval.model_copy(update={"tasks": args.eval_tasks})
        if args.quick:
            update.update(model="tiny", steps=1 if args.smoke else 2)
        config = base.model_copy(update=update)
        if not args.report_only:
            EmbeddedTrainer(config, echo=print).run(resume=args.resume)
        runs.append(_run_record(seed, config.output_dir))
        print(json.dumps(runs[-1]["eval"]), flush=True)
    report = _report(base.model_dump(mode="json"), runs)
    (out / "summary.json").write_text(json.dumps(report, indent=2))
    plot = _plot(runs, out / "learning.png")
    print(_markdown(report))
    if plot:
        print(f"curves: {plot}")


def _run_record(seed: int, out: Path) -> dict[str, Any]:
    train = read_jsonl(out / "metrics.jsonl")
    evals = read_jsonl(out / "eval.jsonl")
    return {
        "seed": seed,
        "seconds": sum(r["step_s"] for r in train) + sum(e["eval_s"] for e in evals),
        "steps": len(train),
        "eval": [
            {"step": e["step"], "pass_rate": e["pass_rate"], "sessions": e["sessions"]}
            for e in evals
        ],
        "examples_before": evals[0]["examples"] if evals else [],
        "examples_after": evals[-1]["examples"] if evals else [],
        "reward_curve": [round(r["reward_mean"], 4) for r in train],
        "pass_curve": [round(r["pass_rate"], 4) for r in train],
        "mean_step_s": statistics.fmean(r["step_s"] for r in train) if train else 0.0,
        "max_logprob_mismatch": max((r["logprob_mismatch_max"] for r in train), default=0.0),
        "mean_clip_fraction": statistics.fmean(r["clip_fraction"] for r in train) if train else 0.0,
    }


def _report(config: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    before = [r["eval"][0]["pass_rate"] for r in runs if r["eval"]]
    after = [r["eval"][-1]["pass_rate"] for r in runs if len(r["eval"]) > 1]
    n = runs[0]["eval"][-1]["sessions"] if runs and runs[0]["eval"] else 0
    gain = statistics.fmean(after) - statistics.fmean(before) if after and before else 0.0
    # run-to-run noise: the spread of the same measurement across seeds, before and after
    spread_before = statistics.stdev(before) if len(before) > 1 else 0.0
    spread_after = statistics.stdev(after) if len(after) > 1 else 0.0
    # binomial standard error of one evaluation at the pooled rate
    pooled = statistics.fmean(before + after) if before or after else 0.0
    se = math.sqrt(pooled * (1 - pooled) / n) if n else 0.0
    noise = max(spread_before, spread_after, se)
    return {
        "config": config,
        "runs": runs,
        "before": before,
        "after": after,
        "gain": gain,
        "run_to_run_std_before": spread_before,
        "run_to_run_std_after": spread_after,
        "eval_binomial_se": se,
        "noise": noise,
        "runs_improved": sum(1 for b, a in zip(before, after, strict=False) if a > b),
        "gain_exceeds_2x_noise": gain > 2 * noise,
    }


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        "| run | steps | held-out pass before | after | mean step (s) | max logprob mismatch |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        ev = r["eval"]
        before = f"{ev[0]['pass_rate']:.3f}" if ev else "-"
        after = f"{ev[-1]['pass_rate']:.3f}" if len(ev) > 1 else "-"
        lines.append(
            f"| seed {r['seed']} | {r['steps']} | {before} | {after} | {r['mean_step_s']:.0f} | "
            f"{r['max_logprob_mismatch']:.1e} |"
        )
    lines.append("")
    lines.append(
        f"mean gain {report['gain']:+.3f}; run-to-run std before "
        f"{report['run_to_run_std_before']:.3f}, after {report['run_to_run_std_after']:.3f}; "
        f"binomial SE of one eval {report['eval_binomial_se']:.3f}; "
        f"gain > 2 x noise: {report['gain_exceeds_2x_noise']}"
    )
    return "\n".join(lines)


def _plot(runs: list[dict[str, Any]], path: Path) -> Path | None:
    """Every run's train reward per step and its held-out pass rate before and after."""
    plt = pyplot()
    if plt is None:
        return None
    fig, (train_ax, eval_ax) = plt.subplots(
        1, 2, figsize=(10, 4), dpi=120, gridspec_kw={"width_ratios": [3, 1]}
    )
    for i, r in enumerate(runs):
        color = f"C{i}"
        curve = r["reward_curve"]
        train_ax.plot(range(1, len(curve) + 1), curve, color=color, label=f"seed {r['seed']}")
        if r["eval"]:
            eval_ax.plot(
                [e["step"] for e in r["eval"]],
                [e["pass_rate"] for e in r["eval"]],
                "o-",
                color=color,
            )
    train_ax.set(xlabel="step", ylabel="train reward (mean of the step's sessions)", ylim=(0, 1))
    eval_ax.set(xlabel="step", ylabel="held-out pass rate", ylim=(0, 1))
    train_ax.legend(loc="lower right")
    for ax in (train_ax, eval_ax):
        ax.grid(alpha=0.3)
    fig.suptitle("GRPO through Polar: SmolLM2-135M, arithmetic, CPU")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
