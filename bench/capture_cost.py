"""Capture cost per record: what committing one model call to the SQLite store costs.

The capture store alone, no HTTP: N sessions append records concurrently from one asyncio loop
(as the gateway's handlers do), each session a growing agent conversation. Bodies are the
gateway overhead bench's Claude-Code-sized (80 KB Anthropic request, 20,000 prompt ids, 50
sampled ids with logprobs) or Pi-sized (5 KB, 1,500 prompt ids) calls; each turn's prompt
extends the last one, so prefix sharing works as in a real session.

Per cell: wall ms per record (sessions x turns appends over the elapsed time: the store's
throughput), p50/p99 append latency (submit to commit, what a caller waits), and writer CPU ms
per record (the process's CPU time over the cell, per record: the loop's share is small, as the
records are built before the clock starts). ``--synchronous FULL`` measures the power-loss-safe
mode; the default is NORMAL.

Run from the repository root: ``.venv/bin/python bench/capture_cost.py`` (about 2 minutes),
``--quick`` for fewer records, ``--smoke`` for one tiny cell per mode (seconds, CI). Markdown on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bodies
from polar.capture.records import CaptureRecord
from polar.capture.store import CaptureStore

SIZES = {"claude_code": 20_000, "pi": 1_500}  # prompt ids of the first turn
SAMPLED = 50


def session_records(session: str, body: str, turns: int) -> list[CaptureRecord]:
    """One session's records in call order: each prompt is the last prompt + reply + new text."""
    conv = _bodies.conversation(body)
    provider, _ = _bodies.BODIES[body]
    request = _bodies.RENDERERS[provider](conv, False)
    base = abs(hash(session)) % 1000
    prompt = [(base + i) % 49_000 for i in range(SIZES[body])]
    records = []
    for turn in range(turns):
        sampled = [(turn * 7 + i) % 49_000 for i in range(SAMPLED)]
        now = time.time()
        records.append(
            CaptureRecord(
                completion_id=f"{session}-{turn}",
                session_id=session,
                provider=provider,
                model="bench-model",
                engine="vllm",
                started_at=now,
                finished_at=now,
                request=request,
                upstream_request={"model": "bench-model", "messages": request.get("messages")},
                response={"role": "assistant", "content": "ok"},
                prompt_ids=list(prompt),
                sampled_ids=sampled,
                logprobs=[-0.5 - i / 100 for i in range(SAMPLED)],
                finish_reason="stop",
            )
        )
        prompt = [*prompt, *sampled, *range(turn, turn + 200)]
    return records


async def run_cell(
    path: Path, body: str, sessions: int, turns: int, synchronous: str
) -> dict[str, Any]:
    store = CaptureStore(path, synchronous=synchronous)
    per_session = [session_records(f"s{s}", body, turns) for s in range(sessions)]
    latencies: list[float] = []

    async def one_session(records: list[CaptureRecord]) -> None:
        for record in records:
            t0 = time.perf_counter()
            await store.append(record)
            latencies.append(time.perf_counter() - t0)

    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one_session(r) for r in per_session))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    store.close()
    n = sessions * turns
    latencies.sort()
    return {
        "body": body,
        "sessions": sessions,
        "records": n,
        "synchronous": synchronous,
        "wall_ms": 1000 * wall / n,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(n - 1, int(0.99 * n))],
        "cpu_ms": 1000 * cpu / n,
        "db_kb": os.path.getsize(path) / 1024 / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer turns per session")
    parser.add_argument("--synchronous", nargs="+", default=["NORMAL", "FULL"])
    parser.add_argument("--bodies", nargs="+", default=list(SIZES))
    parser.add_argument("--sessions", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--repeat", type=int, default=5, help="best of N runs per cell")
    parser.add_argument("--smoke", action="store_true", help="one tiny cell per mode (CI)")
    args = parser.parse_args()
    turns = 10 if args.quick else 30  # per session; a lone session runs 4x as many
    if args.smoke:
        turns, args.bodies, args.sessions, args.repeat = 1, ["pi"], [1, 2], 1
    print(
        "| body | sessions | records | synchronous | wall ms/record | p50 ms | p99 ms "
        "| CPU ms/record | DB KB/record |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for body in args.bodies:
        for sessions in args.sessions:
            for sync in args.synchronous:
                runs = []
                for _ in range(args.repeat):
                    with tempfile.TemporaryDirectory() as tmp:
                        n = turns * 4 if sessions == 1 else turns
                        cell = run_cell(Path(tmp) / "c.db", body, sessions, n, sync)
                        runs.append(asyncio.run(cell))
                r = min(runs, key=lambda c: c["wall_ms"])
                print(
                    f"| {body} | {sessions} | {r['records']} | {sync} | {r['wall_ms']:.2f} "
                    f"| {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['cpu_ms']:.2f} "
                    f"| {r['db_kb']:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
