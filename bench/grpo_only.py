"""GRPO alone through Codex, a protocol its fixed starting checkpoint never saw: the gain.

From one fixed checkpoint, does GRPO through real Codex improve held-out success by more than
the noise?

The fixed checkpoint is the ``tool_use`` recipe's warm start through Pi (scripted
demonstrations through Pi's bash tool, then SFT; no GRPO), made once under ``--out/warm`` and
reused by every seed and every rerun. It has only seen Pi's prompt and its ``bash`` tool
(Chat Completions, ``{"command": ...}``); each seed then runs GRPO alone through Codex
(OpenAI Responses, ``exec_command`` with ``{"cmd": ...}``, Codex's compact preset) on the same
chore kinds: held-out evaluation through Codex before, ``--steps`` GRPO steps, evaluation
after. The held-out chores are the same for every seed (``eval_seed``); seeds differ only in
GRPO's sampling and training chores. Each seed's run is a process of its own (its peak RSS is
its own).

Reported per seed: held-out before / after / gain, training pass per step, step and run wall
time, mean seconds per model call, peak RSS; then the mean gain, the std over seeds of the
after rate and of the gain, one evaluation's binomial SE, and the two tests (gain > 3 x spread,
> 3 x SE; the spread is n/a with one seed).

    python bench/grpo_only.py --seeds 0 1 2 --out bench-results/grpo-only
    python bench/grpo_only.py --smoke                        # tiny model, 1 step (CI)
    python bench/grpo_only.py --seeds 0 1 2 --report-only --out bench-results/grpo-only
    bash bench/grpo_gain_sized.sh                            # sized for signal (issue 39)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
from pathlib import Path
from typing import Any

from _shared_start import (
    add_sizes,
    fmt,
    recipe_from,
    run_arms_apart,
    smoke_sizes,
    wall,
    warm_start,
)
from polar.capture.store import CaptureStore
from tool_use import _num, _verdict, run_record, summarise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    add_sizes(parser)
    parser.set_defaults(steps=6, per_step=4, eval_tasks=18, sft_tasks=32, threads=2)  # the recipe's
    parser.add_argument("--eval-seed", type=int, default=0, help="picks the held-out chores")
    parser.add_argument("--sft-epochs", type=int, help="warm-start epochs (default the recipe's)")
    parser.add_argument("--warm-seed", type=int, default=0, help="the fixed checkpoint's seed")
    parser.add_argument("--out", default="bench-results/grpo-only")
    parser.add_argument("--smoke", action="store_true", help="tiny model, 1 step, 1 seed (CI)")
    parser.add_argument("--report-only", action="store_true", help="summarise runs in --out")
    parser.add_argument(
        "--warm-only",
        action="store_true",
        help="make the fixed checkpoint and stop (seeds can "
        "then run side by side, one process each)",
    )
    args = parser.parse_args()
    model = smoke_sizes(args, "grpo-only")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    warm_dir = out / "warm"
    if not args.report_only:
        fixed_checkpoint(recipe_from(args, model, args.warm_seed, {}), warm_dir)
    if args.warm_only:
        return
    through_codex = {"harness": "codex", "eval_seed": args.eval_seed}
    runs = []
    for seed in args.seeds:
        arm_dir = out / f"seed-{seed}"
        if not args.report_only:
            arm = recipe_from(args, model, seed, through_codex)
            run_arms_apart([(arm, warm_dir, arm_dir)], together=False)
        runs.append(seed_record(seed, arm_dir))
        print(json.dumps({k: runs[-1][k] for k in ("seed", "before", "after")}), flush=True)
    config = recipe_from(args, model, args.seeds[0], through_codex)
    report = summarise(config.model_dump(mode="json"), runs)
    report.update(gain_noise(runs), warm=wall(warm_dir), args=vars(args))
    (out / "summary.json").write_text(json.dumps(report, indent=2))
    print(markdown(report))


def fixed_checkpoint(base: Any, warm_dir: Path) -> None:
    """The warm start through Pi, made once: a rerun (or another seed) reuses it, and refuses
    one made with a different model, seed or demonstration count.

    Made in a process of its own: Linux carries a process's peak RSS over to the programs it
    starts, so a seed's process spawned after an SFT in this one reported the SFT's peak as its
    own (2,952 MiB, above the seed's 1,931 MiB at that point)."""
    made = {
        "model": base.model,
        "seed": base.seed,
        "sft": base.sft.model_dump(mode="json"),
        "harness": base.tasks.options.get("harness"),
    }
    record = warm_dir / "fixed_checkpoint.json"
    if record.exists():
        cached = json.loads(record.read_text())
        if cached != made:
            raise SystemExit(
                f"{warm_dir} holds a checkpoint made with {cached}, not {made}: "
                "use another --out or remove it"
            )
        print(f"the fixed checkpoint: {warm_dir} (reused)", flush=True)
        return
    proc = multiprocessing.get_context("spawn").Process(target=warm_start, args=(base, warm_dir))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise SystemExit(f"the warm start's process failed (exit code {proc.exitcode})")
    record.write_text(json.dumps(made, indent=2))


def seed_record(seed: int, arm_dir: Path) -> dict[str, Any]:
    """bench/tool_use's record of a run, with this arm's peak RSS and seconds per model call."""
    record = run_record(seed, arm_dir)
    record["peak_rss_mib"] = wall(arm_dir)["peak_rss_mib"]
    record["call_s"] = call_seconds(arm_dir / "polar" / "captures.db")
    before, after = record["before"], record["after"]
    record["gain"] = after["pass_rate"] - before["pass_rate"] if before and after else None
    return record


def call_seconds(db: Path) -> float | None:
    """Mean wall seconds of one model call (request to last token), over every captured call."""
    if not db.exists():
        return None
    store = CaptureStore(db)
    try:
        spans = [
            row["finished_at"] - row["started_at"]
            for sid in store.sessions()
            for row in store.summaries(sid)
        ]
    finally:
        store.close()
    return statistics.fmean(spans) if spans else None


def gain_noise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The std over seeds of the gain (None for one seed, not 0) and the brief's two tests:
    the mean gain against 3 x the larger of that std and the after rate's, and against 3 x one
    evaluation's binomial SE (before or after, the larger)."""
    gains = [r["gain"] for r in runs if r["gain"] is not None]
    after = [r["after"]["pass_rate"] for r in runs if r["after"]]
    std_gain = statistics.stdev(gains) if len(gains) > 1 else None
    std_after = statistics.stdev(after) if len(after) > 1 else None
    mean_gain = statistics.fmean(gains) if gains else 0.0
    spread = None if std_gain is None or std_after is None else max(std_gain, std_after)
    return {
        "gains": gains,
        "std_gain": std_gain,
        "std_after": std_after,
        "mean_gain": mean_gain,
        "grpo_gain_exceeds_3x_spread": None if spread is None else mean_gain > 3 * spread,
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| seed | held-out before | after GRPO | gain | train pass per step | step (s) "
        "| s per call | run (min) | peak RSS (MiB) |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in report["runs"]:

        def rate(e: dict[str, Any] | None) -> str:
            return "-" if e is None else f"{e['pass_rate']:.2f} ({e['calls_per_session']:.1f})"

        run_min = r["run_s"] / 60 if r["run_s"] else None
        lines.append(
            f"| {r['seed']} | {rate(r['before'])} | {rate(r['after'])} | {fmt(r['gain'])} "
            f"| {r['train_pass']} | {r['mean_step_s']:.0f} | {fmt(r['call_s'], 1)} "
            f"| {fmt(run_min, 1)} | {r['peak_rss_mib']} |"
        )
    se = report["eval_binomial_se"]
    warm = report["warm"]
    lines += [
        "",
        "cells: held-out success (model calls per session); the fixed checkpoint (warm start "
        f"through Pi) took {warm['wall_s'] / 60:.1f} min, peak {warm['peak_rss_mib']} MiB",
        "",
        f"mean gain {report['mean_gain']:+.3f}; std over seeds of the gain "
        f"{_num(report['std_gain'])}, of after {_num(report['std_after'])}; binomial SE of one "
        f"eval before / after {se['before']:.3f} / {se['after']:.3f} "
        f"(n = {report['eval_tasks']}); gain > 3 x spread: "
        f"{_verdict(report['grpo_gain_exceeds_3x_spread'])}, > 3 x SE: "
        f"{_verdict(report['gain_exceeds_3x_se'])}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
