"""Per-turn credit benchmark: does turn-level credit from a tool-error verifier change what GRPO
learns, against session reward alone, on the same seeds?

The setup is the ``tool_use`` recipe (SmolLM2-135M-Instruct on the embedded engine, real Pi in
bubblewrap, workspace chores checked by a command): sessions of several bash tool calls, some of
which fail (a wrong file name, a bad command), while the session reward is the final check
only, so a failed call in a session that still passed is invisible to session credit. Every
task carries the ``tool_errors`` hook in both arms (the verifier scores each tool-calling turn:
-1 when its result reports a failure, else 0), so both arms report the same measures; only
``advantage.turn_reward_weight`` differs: 0 (session credit) against ``--weight`` (turn credit).

Per seed, one warm start (scripted demonstrations through Pi, then SFT) is shared by the two
arms: its checkpoint seeds both, so they start from the same weights and differ only in credit.
Each arm then evaluates the held-out chores, runs the GRPO steps and evaluates again.

    python bench/turn_credit.py --seeds 0 1 --threads 1 --out bench-results/turn-credit
    python bench/turn_credit.py --smoke        # tiny model, one step of each arm (CI)
    python bench/turn_credit.py --seeds 0 1 --report-only --out bench-results/turn-credit

Writes ``<out>/summary.json`` and every run's files under ``<out>/seed-N/{warm,w0,wX}/``, and
prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from _shared_start import add_sizes, fmt, recipe_from, run_arm, smoke_sizes, wall, warm_start
from polar.training.metrics import read_jsonl
from polar.training.trainer_config import TrainConfig

HOOKS = [{"strategy": "tool_errors"}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--weight", type=float, default=0.5, help="turn_reward_weight of arm 2")
    add_sizes(parser)
    parser.add_argument("--out", default="bench-results/turn-credit")
    parser.add_argument("--smoke", action="store_true", help="tiny model, 1 step per arm (CI)")
    parser.add_argument("--report-only", action="store_true", help="summarise runs in --out")
    args = parser.parse_args()
    model = smoke_sizes(args, "turn-credit")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arms = {"w0": 0.0, f"w{args.weight:g}": args.weight}
    runs = []
    for seed in args.seeds:
        base = config(args, model, seed)
        warm_dir = out / f"seed-{seed}" / "warm"
        if not args.report_only:
            warm_start(base, warm_dir)
        for name, weight in arms.items():
            arm_dir = out / f"seed-{seed}" / name
            if not args.report_only:
                run_arm(with_weight(base, weight), warm_dir, arm_dir)
            runs.append({"seed": seed, "arm": name, "weight": weight, **arm_record(arm_dir)})
            print(json.dumps(runs[-1]["summary"]), flush=True)
    report = {"args": vars(args), "runs": runs, "arms": summarise(runs, list(arms))}
    (out / "summary.json").write_text(json.dumps(report, indent=2))
    print(markdown(report))


def config(args: argparse.Namespace, model: str, seed: int) -> TrainConfig:
    """The tool_use recipe with both arms' hooks, this bench's sizes and one seed."""
    return recipe_from(args, model, seed, {"turn_rewards": HOOKS})


def with_weight(base: TrainConfig, weight: float) -> TrainConfig:
    advantage = base.algorithm.advantage.model_copy(update={"turn_reward_weight": weight})
    algorithm = base.algorithm.model_copy(update={"advantage": advantage})
    return base.model_copy(update={"algorithm": algorithm})


def arm_record(out: Path) -> dict[str, Any]:
    """One arm's numbers: held-out before/after, each training step, and the summary."""
    train = read_jsonl(out / "metrics.jsonl")
    evals = read_jsonl(out / "eval.jsonl")
    before = shape(evals[0]) if evals else None
    after = shape(evals[-1]) if len(evals) > 1 else None
    steps = [shape(r) for r in train]
    trained = pooled(train)
    return {
        "before": before,
        "after": after,
        "steps": steps,
        "run_s": wall(out)["wall_s"],
        "summary": {
            "arm": out.name,
            "seed": out.parent.name,
            "before_pass": before and before["pass_rate"],
            "after_pass": after and after["pass_rate"],
            **{f"train_{k}": v for k, v in trained.items()},
            "after_error_rate": after and after["tool_error_rate"],
            "after_calls_per_session": after and after["calls_per_session"],
        },
    }


def shape(record: dict[str, Any]) -> dict[str, Any]:
    turns = record.get("turn_rewards") or {}
    scored = turns.get("scored", 0)
    return {
        "sessions": record["sessions"],
        "pass_rate": round(record["pass_rate"], 4),
        "calls_per_session": round(record["calls_per_session"], 3),
        "tool_calls": scored,
        "failed_tool_calls": turns.get("negative", 0),
        "tool_error_rate": round(turns.get("negative", 0) / scored, 4) if scored else None,
        "no_tool_sessions": turns.get("sessions_unscored", 0),
        "merge_breaks": record["merge_breaks"],
    }


def pooled(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Training sessions of every step together (steps 2.. only: step 1 is the warm start's
    policy in both arms, so it says nothing about credit)."""
    later = records[1:] or records
    sessions = sum(r["sessions"] for r in later)
    if not sessions:
        return {}
    scored = sum(r["turn_rewards"]["scored"] for r in later)
    failed = sum(r["turn_rewards"]["negative"] for r in later)
    return {
        "sessions": sessions,
        "pass": round(sum(r["pass_rate"] * r["sessions"] for r in later) / sessions, 4),
        "calls_per_session": round(
            sum(r["calls_per_session"] * r["sessions"] for r in later) / sessions, 3
        ),
        "tool_error_rate": round(failed / scored, 4) if scored else None,
        "no_tool_sessions": sum(r["turn_rewards"]["sessions_unscored"] for r in later),
    }


def summarise(runs: list[dict[str, Any]], arms: list[str]) -> dict[str, Any]:
    """Per arm: the mean over seeds of each summary figure."""
    out: dict[str, Any] = {}
    for arm in arms:
        rows = [r["summary"] for r in runs if r["arm"] == arm]
        keys = [k for k in rows[0] if k not in ("arm", "seed")] if rows else []
        out[arm] = {
            k: round(statistics.fmean(vals), 4)
            for k in keys
            if (vals := [r[k] for r in rows if isinstance(r.get(k), int | float)])
        }
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| seed | arm | held-out before → after | calls/session after | tool-error rate after "
        "| train pass (steps 2..) | train calls/session | train tool-error rate "
        "| no-tool sessions (train) | run (min) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        s = r["summary"]
        lines.append(
            f"| {r['seed']} | {r['arm']} | {fmt(s['before_pass'])} → {fmt(s['after_pass'])} "
            f"| {fmt(s['after_calls_per_session'])} | {fmt(s['after_error_rate'])} "
            f"| {fmt(s.get('train_pass'))} | {fmt(s.get('train_calls_per_session'))} "
            f"| {fmt(s.get('train_tool_error_rate'))} | {s.get('train_no_tool_sessions', '-')}"
            f"/{s.get('train_sessions', '-')} | {r['run_s'] / 60:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
