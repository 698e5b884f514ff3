"""Tool-use benchmark: does the `tool_use` recipe make SmolLM2-135M better at doing workspace
chores through real Pi (bubblewrap, embedded engine, CPU)?

Each run trains the bundled ``tool_use`` config (warm start: scripted demonstrations through
Pi, then SFT; then GRPO) from the same base weights with a different seed, evaluating the same
held-out chores before, after the warm start, and after GRPO. It reports held-out success
with the run-to-run spread and the binomial standard error of one evaluation, the session
shape (model calls per session and per trace, merge breaks), and wall time per step and run.

    python bench/tool_use.py --runs 3 --out bench-results/tool-use
    python bench/tool_use.py --runs 1 --steps 2 --eval-tasks 6     # a short look
    python bench/tool_use.py --quick                                # tiny model, plumbing
    python bench/tool_use.py --smoke                                # smaller still (CI)
    python bench/tool_use.py --runs 3 --report-only                 # re-summarise

Writes ``<out>/summary.json``, ``<out>/tool_use.png`` and every run's files under
``<out>/seed-N/``, and prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from polar.cli.train import load_config
from polar.training.metrics import pyplot, read_jsonl
from polar.training.trainer import EmbeddedTrainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="tool_use", help="bundled name or YAML path")
    parser.add_argument("--runs", type=int, default=3, help="training runs (seeds 0..N-1)")
    parser.add_argument("--seeds", type=int, nargs="+", help="exactly these seeds instead")
    parser.add_argument("--steps", type=int, help="override steps")
    parser.add_argument("--eval-tasks", type=int, help="override eval.tasks")
    parser.add_argument("--sft-tasks", type=int, help="override sft.tasks")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--out", default="bench-results/tool-use")
    parser.add_argument("--quick", action="store_true", help="tiny model, 1 step (plumbing)")
    parser.add_argument(
        "--smoke", action="store_true", help="one run, tiny model, 2 tasks per phase (CI)"
    )
    parser.add_argument("--report-only", action="store_true", help="summarise runs in --out")
    args = parser.parse_args()
    if args.smoke:
        args.quick, args.runs, args.seeds, args.eval_tasks, args.sft_tasks = True, 1, None, 2, 2
        args.out = tempfile.mkdtemp(prefix="polar-bench-tool-use-")

    base = load_config(args.config)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for seed in args.seeds if args.seeds is not None else range(args.runs):
        update: dict[str, Any] = {"seed": seed, "output_dir": out / f"seed-{seed}"}
        if args.threads:
            update["threads"] = args.threads
        if args.steps is not None:
            update["steps"] = args.steps
        if args.eval_tasks is not None:
            update["eval"] = base.eval.model_copy(update={"tasks": args.eval_tasks})
        if args.sft_tasks is not None:
            update["sft"] = base.sft.model_copy(update={"tasks": args.sft_tasks})
        if args.quick:
            update.update(model="tiny", steps=1)
        config = base.model_copy(update=update)
        if not args.report_only:
            started = time.perf_counter()
            EmbeddedTrainer(config, echo=print).run(resume=False)
            wall = time.perf_counter() - started
            peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
            (config.output_dir / "wall_s.json").write_text(
                json.dumps({"wall_s": wall, "peak_rss_mb": round(peak_mb)})
            )
        runs.append(run_record(seed, config.output_dir))
        print(json.dumps({k: runs[-1][k] for k in ("seed", "before", "sft", "after")}), flush=True)
    report = summarise(base.model_dump(mode="json"), runs)
    (out / "summary.json").write_text(json.dumps(report, indent=2))
    plot = plot_runs(runs, out / "tool_use.png")
    print(markdown(report))
    if plot:
        print(f"plot: {plot}")


def run_record(seed: int, out: Path) -> dict[str, Any]:
    train = read_jsonl(out / "metrics.jsonl")
    evals = read_jsonl(out / "eval.jsonl")
    warm = read_jsonl(out / "warm_start.jsonl")
    wall = out / "wall_s.json"
    before = next((e for e in evals if e["step"] == 0 and "phase" not in e), None)
    sft = next((e for e in evals if e.get("phase") == "sft"), None)
    after = evals[-1] if evals and evals[-1]["step"] > 0 else None

    def shape(e: dict[str, Any] | None) -> dict[str, Any] | None:
        if e is None or not e["sessions"]:
            return None
        keys = ("pass_rate", "sessions", "calls_per_session", "calls_per_trace", "merge_breaks")
        return {**{k: e[k] for k in keys}, "by_kind": e.get("by_kind", {})}

    return {
        "seed": seed,
        "before": shape(before),
        "sft": shape(sft),
        "after": shape(after),
        "warm_start": {
            k: warm[0][k]
            for k in ("rows", "pass_rate", "calls_per_trace", "demonstrate_s", "sft_s", "epochs")
        }
        if warm
        else None,
        "steps": len(train),
        "train_pass": [round(r["pass_rate"], 4) for r in train],
        "train_calls_per_session": [round(r["calls_per_session"], 3) for r in train],
        "mean_step_s": statistics.fmean(r["step_s"] for r in train) if train else 0.0,
        "eval_s": [round(e["eval_s"], 1) for e in evals],
        "run_s": json.loads(wall.read_text())["wall_s"] if wall.exists() else None,
        "peak_rss_mb": json.loads(wall.read_text()).get("peak_rss_mb") if wall.exists() else None,
        "max_logprob_mismatch": max((r["logprob_mismatch_max"] for r in train), default=0.0),
        "examples_after": evals[-1]["examples"] if evals else [],
    }


def summarise(config: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    def rates(phase: str) -> list[float]:
        return [r[phase]["pass_rate"] for r in runs if r[phase] is not None]

    def spread(xs: list[float]) -> float | None:  # undefined for one run, not 0
        return statistics.stdev(xs) if len(xs) > 1 else None

    def exceeds(x: float, *noise: float | None) -> bool | None:
        """x > 3 x the largest noise term; None where a spread is undefined (one run)."""
        return None if None in noise else x > 3 * max(n for n in noise if n is not None)

    def mean(xs: list[float]) -> float:
        return statistics.fmean(xs) if xs else 0.0

    before, sft, after = rates("before"), rates("sft"), rates("after")
    n = next((r["before"]["sessions"] for r in runs if r["before"]), 0)

    def se(p: float) -> float:  # binomial standard error of one evaluation at rate p
        return math.sqrt(p * (1 - p) / n) if n else 0.0

    gain = mean(after) - mean(before)
    grpo_gain = mean(after) - mean(sft) if sft else None
    return {
        "config": config,
        "runs": runs,
        "before": before,
        "after_sft": sft,
        "after": after,
        "gain": gain,
        "gain_from_grpo": grpo_gain,
        "run_to_run_std_before": spread(before),
        "run_to_run_std_after_sft": spread(sft),
        "run_to_run_std_after": spread(after),
        "eval_tasks": n,
        "eval_binomial_se": {
            "before": se(mean(before)),
            "after_sft": se(mean(sft)),
            "after": se(mean(after)),
        },
        "gain_exceeds_3x_spread": exceeds(gain, spread(before), spread(after)),
        "grpo_gain_exceeds_3x_spread": None
        if grpo_gain is None
        else exceeds(grpo_gain, spread(sft), spread(after)),
        "gain_exceeds_3x_se": exceeds(gain, se(mean(before)), se(mean(after))),
        "grpo_gain_exceeds_3x_se": None
        if grpo_gain is None
        else exceeds(grpo_gain, se(mean(sft)), se(mean(after))),
        "calls_per_session_before": mean(
            [r["before"]["calls_per_session"] for r in runs if r["before"]]
        ),
        "calls_per_session_after": mean(
            [r["after"]["calls_per_session"] for r in runs if r["after"]]
        ),
        "calls_per_trace_before": mean(
            [r["before"]["calls_per_trace"] for r in runs if r["before"]]
        ),
        "calls_per_trace_after": mean([r["after"]["calls_per_trace"] for r in runs if r["after"]]),
        "mean_step_s": mean([r["mean_step_s"] for r in runs if r["steps"]]),
        "mean_run_s": mean([r["run_s"] for r in runs if r["run_s"]]),
    }


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _verdict(x: bool | None) -> str:
    return "n/a (one run: no spread)" if x is None else str(x)


def markdown(report: dict[str, Any]) -> str:
    def cell(e: dict[str, Any] | None) -> str:
        if e is None:
            return "-"
        return f"{e['pass_rate']:.2f} ({e['calls_per_session']:.2f} / {e['calls_per_trace']:.2f})"

    lines = [
        "| run | held-out before | after warm start | after GRPO | GRPO steps | step (s) | run (min) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        run_min = f"{r['run_s'] / 60:.1f}" if r["run_s"] else "-"
        lines.append(
            f"| seed {r['seed']} | {cell(r['before'])} | {cell(r['sft'])} | {cell(r['after'])} "
            f"| {r['steps']} | {r['mean_step_s']:.0f} | {run_min} |"
        )
    lines += [
        "",
        "cells: held-out success (model calls per session / per trace)",
        "",
        f"mean gain {report['gain']:+.3f} (GRPO's part: {_num(report['gain_from_grpo'])}); "
        f"run-to-run std before {_num(report['run_to_run_std_before'])}, after warm start "
        f"{_num(report['run_to_run_std_after_sft'])}, after "
        f"{_num(report['run_to_run_std_after'])}; "
        "binomial SE of one eval (before / after warm start / after): "
        + " / ".join(f"{v:.3f}" for v in report["eval_binomial_se"].values())
        + f" (n = {report['eval_tasks']}); gain > 3 x spread: "
        f"{_verdict(report['gain_exceeds_3x_spread'])}, > 3 x SE: "
        f"{_verdict(report['gain_exceeds_3x_se'])}; GRPO's part > 3 x spread: "
        f"{_verdict(report['grpo_gain_exceeds_3x_spread'])}, > 3 x SE: "
        f"{_verdict(report['grpo_gain_exceeds_3x_se'])}",
    ]
    return "\n".join(lines)


def plot_runs(runs: list[dict[str, Any]], path: Path) -> Path | None:
    """Every run's held-out success at each phase, and its train success per GRPO step."""
    plt = pyplot()
    if plt is None:
        return None
    fig, (eval_ax, train_ax) = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    phases = ("before", "sft", "after")
    for i, r in enumerate(runs):
        xs = [j for j, p in enumerate(phases) if r[p] is not None]
        eval_ax.plot(
            xs,
            [r[phases[j]]["pass_rate"] for j in xs],
            "o-",
            color=f"C{i}",
            label=f"seed {r['seed']}",
        )
        train_ax.plot(range(1, len(r["train_pass"]) + 1), r["train_pass"], "o-", color=f"C{i}")
    eval_ax.set_xticks(range(3), ["base", "warm start", "GRPO"])
    eval_ax.set(ylabel="held-out success", ylim=(0, 1))
    train_ax.set(xlabel="GRPO step", ylabel="train success (step's sessions)", ylim=(0, 1))
    eval_ax.legend(loc="upper left")
    for ax in (eval_ax, train_ax):
        ax.grid(alpha=0.3)
    fig.suptitle("tool_use through real Pi: SmolLM2-135M, CPU")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
