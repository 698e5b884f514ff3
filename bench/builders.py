"""Benchmark the trajectory builders on long synthetic sessions.

Sessions of 10, 50 and 200 agent turns whose prompts grow from half the context to the full
context (8k or 32k tokens), so a 200-turn 32k session captures ~4.8M prompt tokens. Token ids
are synthetic (builders only compare ids); the structure is a chat session's: a long system
prompt, sampled turns ending in an end-of-turn id, and tool results with template glue between
them. Reports build time (best of N), peak traced memory (tracemalloc, separate run), the
session's unique tokens and total captured prompt tokens, and completions per trace.

    python bench/builders.py            # full grid, markdown table on stdout
    python bench/builders.py --quick    # 10 and 50 turns only
    python bench/builders.py --smoke    # 10 turns at 8k, once: seconds (CI)
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from typing import Any

import numpy as np

from polar.capture.records import CaptureRecord
from polar.trajectory.registry import create_builder

EOT = 2
GLUE = [198, 1, 4093, 198]  # "\n<|im_start|>user\n"
GEN_PROMPT = [2, 198, 1, 520, 9531, 198]  # "<|im_end|>\n<|im_start|>assistant\n"


def session(turns: int, context: int, seed: int = 0) -> list[CaptureRecord]:
    """One agent's calls; prompts share their Python int objects, as slices of one list."""
    rng = np.random.default_rng(seed)
    system = context // 2
    per_turn = (context - system) // turns
    sampled_len = max(4, per_turn * 3 // 10)
    tool_len = max(1, per_turn - sampled_len - len(GLUE) - len(GEN_PROMPT))
    pieces = [rng.integers(100, 49000, system)]
    bounds: list[tuple[int, int]] = []  # (prompt length, sampled length) per call
    length = system
    for _ in range(turns):
        sampled = np.append(rng.integers(100, 49000, sampled_len - 1), EOT)
        bounds.append((length, len(sampled)))
        tool = rng.integers(100, 49000, tool_len)
        pieces += [sampled, np.array(GLUE), tool, np.array(GEN_PROMPT)]
        length += len(sampled) + len(GLUE) + len(tool) + len(GEN_PROMPT)
    full = np.concatenate(pieces).tolist()
    return [
        CaptureRecord.model_construct(
            completion_id=f"c{i}",
            session_id="bench",
            seq=i,
            provider="openai_chat",
            model="m",
            engine="bench",
            policy_version=None,
            started_at=float(i),
            finished_at=float(i),
            request=None,
            upstream_request={"messages": []},
            response={"role": "assistant", "content": ""},
            prompt_ids=full[:start],
            sampled_ids=full[start : start + n],
            logprobs=[-0.5] * n,
            finish_reason="stop",
            sampling={},
            flags=[],
            tags=[],
            dropped_tools=[],
        )
        for i, (start, n) in enumerate(bounds)
    ]


def measure(strategy: str, records: list[CaptureRecord], repeats: int) -> dict[str, Any]:
    builder = create_builder(strategy, {"eot_token_id": EOT})
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        traj = builder.build(records)
        times.append(time.perf_counter() - start)
        del traj
    gc.collect()
    tracemalloc.start()
    traj = builder.build(records)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "seconds": min(times),
        "peak_mib": peak / 2**20,
        "traces": len(traj.traces),
        "per_trace": traj.stats.completions_per_trace,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 and 50 turns only")
    parser.add_argument("--smoke", action="store_true", help="10 turns at 8k, once (CI)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    turn_grid = (10,) if args.smoke else (10, 50) if args.quick else (10, 50, 200)
    contexts = (8192,) if args.smoke else (8192, 32768)
    if args.smoke:
        args.repeats = 1
    rows = []
    print(
        "| turns | context | prompt tokens | unique tokens | builder | build s | peak MiB "
        "| traces | calls/trace |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for context in contexts:
        for turns in turn_grid:
            records = session(turns, context)
            prompt_tokens = sum(len(r.prompt_ids) for r in records)
            unique = len(records[-1].prompt_ids) + len(records[-1].sampled_ids)
            for strategy in ("prefix_merging", "per_request"):
                result = measure(strategy, records, args.repeats)
                row = {
                    "turns": turns,
                    "context": context,
                    "prompt_tokens": prompt_tokens,
                    "unique_tokens": unique,
                    "builder": strategy,
                    **result,
                }
                rows.append(row)
                print(
                    f"| {turns} | {context // 1024}k | {prompt_tokens:,} | {unique:,} "
                    f"| {strategy} | {result['seconds']:.3f} | {result['peak_mib']:.1f} "
                    f"| {result['traces']} | {result['per_trace']:.1f} |",
                    flush=True,
                )
            del records
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
