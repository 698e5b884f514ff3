"""Benchmark ``polar quickstart`` end to end: where a run's time goes, run after run.

Each run is the real command (12 Pi sessions in bubblewrap by default, three model calls each:
the suite's conversations, on the embedded SmolLM2) in its own directory; its run directory is then read back:

* when the sessions started and when the first and last of the first model calls arrived,
  counted from the command's start (harness start-up is the gap between the two);
* the median duration of calls that sampled at most 10 tokens (mostly prefill and queueing);
* the engine's prefill counters from ``summary.json`` (prompt tokens computed and reused:
  deterministic, unlike every time here);
* the command's wall time.

Wall times on a shared machine are noisy: run several times (``--runs``) and read the spread.
``--src DIR`` runs another source tree (``PYTHONPATH=DIR``, e.g. an older checkout's ``src``)
to compare against; any other arguments go to ``polar quickstart``.

    python bench/quickstart.py --runs 3
    python bench/quickstart.py --runs 3 --src /tmp/before/src -- --runtime local
    python bench/quickstart.py --smoke     # one tiny run: what CI runs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

POLAR = Path(sys.executable).with_name("polar")
SMOKE = ["--model", "tiny", "--tasks", "1", "--samples", "2"]
SMOKE += ["--max-turns", "3", "--max-tokens", "8"]  # 3: the conversations' three calls


def run_once(out: Path, src: str | None, extra: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    load = os.getloadavg()[0]
    started = time.time()
    proc = subprocess.run(
        [str(POLAR), "quickstart", "--out", str(out), *extra],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    total = time.time() - started
    if proc.returncode not in (0, 1):
        raise SystemExit(f"quickstart failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return {**read_run(out, started), "total_s": total, "load": load}


def read_run(out: Path, started: float) -> dict[str, Any]:
    """What the run directory says about where the time went."""
    summary = json.loads((out / "summary.json").read_text())
    calls = [json.loads(line) for line in (out / "captures.jsonl").read_text().splitlines()]
    run_starts = []
    for line in (out / "log.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "session.run.start":
            stamp = datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()
            run_starts.append(stamp)
    firsts: dict[str, float] = {}
    for call in calls:
        sid = call["session_id"]
        firsts[sid] = min(firsts.get(sid, call["started_at"]), call["started_at"])
    short = [c["finished_at"] - c["started_at"] for c in calls if len(c["sampled_ids"]) <= 10]
    stats = summary["facts"].get("engine_stats", {})
    prefill = stats.get("prefill", {})
    prompt_tokens = sum(len(c["prompt_ids"]) for c in calls)
    # An engine without prefill counters reused only what its prefix cache reports.
    reused = prefill.get("reused_tokens", stats.get("prefix_cache", {}).get("reused_tokens"))
    return {
        "sessions_run_s": min(run_starts) - started if run_starts else float("nan"),
        "first_call_s": min(firsts.values()) - started if firsts else float("nan"),
        "last_first_call_s": max(firsts.values()) - started if firsts else float("nan"),
        "short_call_s": statistics.median(short) if short else float("nan"),
        "calls": len(calls),
        "sampled": sum(len(c["sampled_ids"]) for c in calls),
        "prompt_tokens": prompt_tokens,
        "computed": prefill.get(
            "computed_tokens", None if reused is None else prompt_tokens - reused
        ),
        "reused": reused,
        "passed": summary["total"]["passed"],
    }


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--src", default=None, help="run this source tree (PYTHONPATH)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/polar-bench-quickstart"))
    parser.add_argument("extra", nargs="*", help="arguments for polar quickstart (after --)")
    parser.add_argument(
        "--smoke", action="store_true", help="one run: tiny model, 1 task x 2 sessions (CI)"
    )
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.out = 1, Path(tempfile.mkdtemp(prefix="polar-bench-quickstart-"))
        args.extra = [*SMOKE, *args.extra]
    rows = []
    for index in range(args.runs):
        row = run_once(args.out / f"run-{index}", args.src, args.extra)
        rows.append(row)
        print(
            f"run {index}: {row['total_s']:.1f} s (load {row['load']:.1f}) · sessions run at "
            f"{row['sessions_run_s']:.1f} s · first calls {row['first_call_s']:.1f}-"
            f"{row['last_first_call_s']:.1f} s · <=10-token calls {row['short_call_s']:.1f} s · "
            f"prefill computed {row['computed']} reused {row['reused']} of "
            f"{row['prompt_tokens']} · {row['calls']} calls, {row['sampled']} sampled tokens",
            flush=True,
        )
    print("\n| runs | wall s | sessions run at s | first calls at s | <=10-token call s | "
          "prefill computed / reused / prompt tokens |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    counters = sorted({f"{r['computed']} / {r['reused']} / {r['prompt_tokens']}" for r in rows})
    print(
        f"| {len(rows)} | {spread([r['total_s'] for r in rows])} | "
        f"{spread([r['sessions_run_s'] for r in rows])} | "
        f"{spread([r['first_call_s'] for r in rows])} | "
        f"{spread([r['short_call_s'] for r in rows])} | {', '.join(counters)} |"
    )
    print("(median, min-max)")


if __name__ == "__main__":
    main()
