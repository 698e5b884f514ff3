"""Builder ablation: the same GRPO run with the prefix_merging builder and with per_request, on
sessions long enough to matter, from one shared warm start.

The setup is the ``tool_use`` recipe (SmolLM2-135M-Instruct on the embedded engine, real Pi in
bubblewrap, checked workspace chores) on its ``gather`` chores: read 3 to 5 seeded files, one
call each, and write their words into answer.txt, 5 to 7 model calls a session. Per seed, one
warm start (scripted demonstrations through Pi, SFT) seeds both arms from its checkpoint; each
arm then evaluates the held-out chores, runs the same GRPO steps (the same chores per step,
seeded by step) and evaluates again. Only ``tasks.options.builder`` differs, in GRPO's batches
alone: the warm start is the same weights for both. Each arm runs in a process of its own, so
its peak memory is its own; ``--together`` runs the two arms at once (half the wall time on 2
cores; both then share the load).

Reported per arm: trainer sequences and tokens forwarded per step (prompt + response of every
sequence), trainable tokens, optimizer updates, update and whole-step wall time, peak RSS,
session shape and held-out success; then the ratio per_request / prefix_merging, and the
first-principles prediction from the captured calls of the prefix_merging arm's own training
sessions: per_request forwards every call's prompt and sample, sum_i (P_i + S_i), a merged
session about its last call's, P_n + S_n.

    python bench/builder_ablation.py --seeds 0 --together --out bench-results/builder-ablation
    python bench/builder_ablation.py --smoke            # tiny model, one step of each arm (CI)
    python bench/builder_ablation.py --seeds 0 --report-only --out bench-results/builder-ablation
"""

from __future__ import annotations

import argparse
import json
import re
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
from polar.capture.records import CaptureRecord
from polar.capture.store import CaptureStore
from polar.training.metrics import read_jsonl

ARMS = ("prefix_merging", "per_request")
SHORTCUTS = (
    ("passed", "passed"),
    ("passed without reading every file", "passed_without_reading_all"),
    ("no tool call", "no_tool_call"),
    ("echo calls only", "echo_only"),
    ("at the call limit", "at_call_limit"),
    ("repeated identical calls (calls)", "repeated_calls"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    add_sizes(parser, sft_tasks=24)
    parser.add_argument(
        "--sft-epochs", type=int, default=2, help="warm-start epochs (16 chores x 1 left 0/12)"
    )
    parser.add_argument("--max-calls", type=int, default=10, help="the gateway's turn limit")
    parser.add_argument("--together", action="store_true", help="run the two arms at once")
    parser.add_argument("--out", default="bench-results/builder-ablation")
    parser.add_argument("--smoke", action="store_true", help="tiny model, 1 step per arm (CI)")
    parser.add_argument("--report-only", action="store_true", help="summarise runs in --out")
    args = parser.parse_args()
    model = smoke_sizes(args, "builder-ablation")
    if args.smoke:
        args.max_calls = 4
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for seed in args.seeds:
        options = {"kinds": ["gather"], "max_calls": args.max_calls}
        base = recipe_from(args, model, seed, options)
        warm_dir = out / f"seed-{seed}" / "warm"
        if not args.report_only:
            warm_start(base, warm_dir)
            jobs = []
            for arm in ARMS:
                tasks = base.tasks.model_copy(
                    update={"options": {**base.tasks.options, "builder": arm}}
                )
                jobs.append(
                    (base.model_copy(update={"tasks": tasks}), warm_dir, out / f"seed-{seed}" / arm)
                )
            run_arms_apart(jobs, together=args.together)
        pair = {arm: arm_record(out / f"seed-{seed}" / arm) for arm in ARMS}
        runs.append({"seed": seed, "warm": wall(warm_dir), "arms": pair, "ratio": ratios(pair)})
        print(json.dumps({"seed": seed, "ratio": runs[-1]["ratio"]}), flush=True)
    report = {"args": vars(args), "runs": runs}
    (out / "summary.json").write_text(json.dumps(report, indent=2))
    print(markdown(report))


def arm_record(arm_dir: Path) -> dict[str, Any]:
    """One arm's figures: per GRPO step means, totals, held-out before and after."""
    steps = read_jsonl(arm_dir / "metrics.jsonl")
    evals = read_jsonl(arm_dir / "eval.jsonl")
    updated = [s for s in steps if s["optimizer_steps"]]
    sessions = train_sessions(arm_dir / "polar" / "captures.db")

    def mean(key: str, rows: list[dict[str, Any]] = steps) -> float | None:
        return statistics.fmean(r[key] for r in rows) if rows else None

    return {
        "steps": len(steps),
        "sequences_per_step": mean("traces"),
        "tokens_forwarded_per_step": mean("total_tokens"),
        "trainable_tokens_per_step": mean("trainable_tokens"),
        "optimizer_updates": sum(s["optimizer_steps"] for s in steps),
        "update_s_per_update": mean("update_s", updated),
        "update_s_total": sum(s["update_s"] for s in steps),
        "step_s_total": sum(s["step_s"] for s in steps),
        "calls_per_session": mean("calls_per_session"),
        "train_pass": [round(s["pass_rate"], 3) for s in steps],
        "before": evals[0]["pass_rate"] if evals else None,
        "after": evals[-1]["pass_rate"] if len(evals) > 1 else None,
        "after_calls_per_session": evals[-1]["calls_per_session"] if len(evals) > 1 else None,
        "logprob_mismatch_max": max((s["logprob_mismatch_max"] for s in steps), default=None),
        "prediction": predicted_ratio(sessions),
        "shortcuts": shortcuts(sessions, verdicts(arm_dir / "polar")),
        **wall(arm_dir),
    }


def train_sessions(db: Path) -> list[tuple[dict[str, Any], list[CaptureRecord]]] | None:
    """The arm's captured training sessions (metadata, calls), read once for both analyses;
    None without a capture store."""
    if not db.exists():
        return None
    store = CaptureStore(db)
    try:
        return [
            (meta, records)
            for sid, meta in store.sessions().items()
            if str(meta.get("task_id", "")).startswith("train") and (records := store.records(sid))
        ]
    finally:
        store.close()


def verdicts(run: Path) -> dict[str, bool]:
    """Session id -> whether the task's check passed, from the rollout server's results."""
    found = {}
    for path in (run / "rollout" / "results").glob("train-*.jsonl"):
        for row in read_jsonl(path):
            found[row["session_id"]] = bool((row.get("evaluation") or {}).get("verdict"))
    return found


def predicted_ratio(
    sessions: list[tuple[dict[str, Any], list[CaptureRecord]]] | None,
) -> dict[str, Any] | None:
    """Tokens a per_request trainer forwards for these sessions, sum_i (P_i + S_i), over a
    merged one's, P_n + S_n (summed over sessions)."""
    if not sessions:
        return None
    per_call = sum(len(r.prompt_ids) + len(r.sampled_ids) for _, calls in sessions for r in calls)
    merged = sum(len(calls[-1].prompt_ids) + len(calls[-1].sampled_ids) for _, calls in sessions)
    calls = sum(len(calls) for _, calls in sessions)
    return {
        "sessions": len(sessions),
        "calls_per_session": round(calls / len(sessions), 2),
        "per_request_tokens": per_call,
        "merged_tokens": merged,
        "ratio": round(per_call / merged, 2),
    }


def shortcuts(
    sessions: list[tuple[dict[str, Any], list[CaptureRecord]]] | None, passed_by: dict[str, bool]
) -> dict[str, int] | None:
    """How an arm's training sessions went about it, where a credit failure would show: a pass
    without a call that read every seeded file (the answer guessed), sessions that only echo
    or call no tool, repeated identical calls, and sessions at the call limit (a loop the
    session-level reward does not tell apart). From the captured calls and the checks' verdicts."""
    if sessions is None:
        return None
    found = dict.fromkeys(
        ("sessions", "passed", "passed_without_reading_all", "no_tool_call", "echo_only"), 0
    )
    found |= {"repeated_calls": 0, "at_call_limit": 0}
    for meta, records in sessions:
        asked = str(records[0].upstream_request["messages"][-1].get("content", ""))
        files = set(re.findall(r"\b[a-e]\.txt\b", asked))
        commands = [c for r in records for c in _commands(r.response)]
        unread = {
            f for f in files if not any(f in c and not c.startswith("echo") for c in commands)
        }
        passed = passed_by.get(records[0].session_id, False)
        limit = meta.get("max_model_calls")
        found["sessions"] += 1
        found["passed"] += passed
        found["passed_without_reading_all"] += passed and bool(unread)
        found["no_tool_call"] += not commands
        found["echo_only"] += bool(commands) and all(c.startswith("echo") for c in commands)
        found["repeated_calls"] += len(commands) - len(set(commands))
        found["at_call_limit"] += limit is not None and len(records) >= limit
    return found


def _commands(message: dict[str, Any]) -> list[str]:
    """The shell commands of an assistant message's tool calls (stripped; a call whose
    arguments do not parse counts by its raw text)."""
    out = []
    for call in message.get("tool_calls") or []:
        raw = call.get("function", {}).get("arguments", "")
        try:
            args = json.loads(raw)
        except ValueError:
            args = None
        command = args.get("command") if isinstance(args, dict) else None
        out.append(str(command if command is not None else raw).strip())
    return out


def ratios(pair: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    merged, per_request = pair["prefix_merging"], pair["per_request"]

    def ratio(key: str) -> float | None:
        a, b = per_request.get(key), merged.get(key)
        return round(a / b, 2) if isinstance(a, int | float) and b else None

    keys = (
        "sequences_per_step",
        "tokens_forwarded_per_step",
        "trainable_tokens_per_step",
        "update_s_per_update",
        "update_s_total",
        "step_s_total",
        "wall_s",
        "peak_rss_mib",
    )
    return {k: ratio(k) for k in keys}


def markdown(report: dict[str, Any]) -> str:
    rows = [
        ("calls per session (train)", "calls_per_session", 2),
        ("trainer sequences per step", "sequences_per_step", 1),
        ("tokens forwarded per step", "tokens_forwarded_per_step", 0),
        ("trainable tokens per step", "trainable_tokens_per_step", 0),
        ("optimizer updates", "optimizer_updates", 0),
        ("update wall time per update (s)", "update_s_per_update", 0),
        ("update wall time, all steps (s)", "update_s_total", 0),
        ("GRPO steps' wall time (s)", "step_s_total", 0),
        ("arm wall time incl. 2 evaluations (s)", "wall_s", 0),
        ("peak RSS (MiB)", "peak_rss_mib", 0),
        ("held-out before", "before", 2),
        ("held-out after", "after", 2),
    ]
    lines = []
    for run in report["runs"]:
        merged, per_request = run["arms"]["prefix_merging"], run["arms"]["per_request"]
        lines += [
            f"seed {run['seed']} (warm start {run['warm']['wall_s'] / 60:.1f} min, "
            f"peak {run['warm']['peak_rss_mib']} MiB)",
            "",
            "| | prefix_merging | per_request | ratio |",
            "|---|---:|---:|---:|",
        ]
        for label, key, digits in rows:
            ratio = run["ratio"].get(key)
            lines.append(
                f"| {label} | {fmt(merged.get(key), digits)} | {fmt(per_request.get(key), digits)} "
                f"| {'' if ratio is None else f'{ratio:.2f}x'} |"
            )
        lines.append(
            f"| train pass per step | {merged['train_pass']} | {per_request['train_pass']} | |"
        )
        for label, key in SHORTCUTS:
            lines.append(
                f"| train sessions: {label} | {_count(merged, key)} | {_count(per_request, key)} | |"
            )
        prediction = merged["prediction"]
        if prediction:
            lines += [
                "",
                f"Predicted from the prefix_merging arm's {prediction['sessions']} training "
                f"sessions ({prediction['calls_per_session']} calls each): per_request would "
                f"forward {prediction['per_request_tokens']:,} tokens against "
                f"{prediction['merged_tokens']:,} merged, {prediction['ratio']}x.",
            ]
        lines.append("")
    return "\n".join(lines)


def _count(arm: dict[str, Any], key: str) -> str:
    found = arm.get("shortcuts")
    if not found:
        return "-"
    return str(found[key]) if key == "repeated_calls" else f"{found[key]} of {found['sessions']}"


if __name__ == "__main__":
    main()
