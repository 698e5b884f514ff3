"""Benchmark shared prefill in the embedded engine: a group of prompts with a common beginning.

The group is the quickstart's: Pi's compact system prompt (date and working directory
included, as in bubblewrap where every session works in /workspace) and its bash and write
tools, then one of the bundled suite's instructions, 4 samples each of the first 3 tasks: 12
prompts of ~430 tokens that share all but the last ~20. Each request generates ``--tokens``
tokens greedily (the quickstart's one-call sessions mostly stop after 8). The group runs:

* ``shared``: as the engine serves it now (the first prompt is read, the others start from it);
* ``unshared``: with ``kv_cache_entries=0``, which turns prefix reuse off: every request pays
  its whole prompt, as every concurrent request did before prefill sharing.

The arrival is ``--arrival``: ``together`` (all queued at once), or ``spread`` (one every
``--gap`` seconds, as Pi processes reach their first call one after another). Prefill token
counts are exact and deterministic; wall times are the best of ``--repeats`` (on a shared
machine noise only ever adds time) with the spread shown.

    python bench/shared_prefill.py                 # SmolLM2-135M-Instruct, 1 thread
    python bench/shared_prefill.py --model tiny --repeats 1
    python bench/shared_prefill.py --smoke         # tiny model, 2 requests: seconds (CI)
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from polar.engines.embedded import EmbeddedEngineCore, GenerationParams, load_model
from polar.harnesses.pi import COMPACT_SETTINGS as PI_COMPACT
from polar.quickstart.tasks import load_suite

# Pi 0.73.1's bash and write tools, as it sends them (captured from a quickstart run).
PI_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Execute a bash command in the current working directory. Returns "
            "stdout and stderr. Output is truncated to last 2000 lines or 50KB (whichever is hit "
            "first). If truncated, full output is saved to a temp file. Optionally provide a "
            "timeout in seconds.",
            "parameters": {
                "type": "object",
                "required": ["command"],
                "properties": {
                    "command": {"type": "string", "description": "Bash command to execute"},
                    "timeout": {
                        "type": "number",
                        "description": "Timeout in seconds (optional, no default timeout)",
                    },
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write",
            "description": "Write content to a file. Creates the file if it doesn't exist, "
            "overwrites if it does. Automatically creates parent directories.",
            "parameters": {
                "type": "object",
                "required": ["path", "content"],
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "Path to the file to write (relative or absolute)",
                    },
                    "content": {"type": "string", "description": "Content to write to the file"},
                },
            },
        },
    },
]


def group(tasks: int, samples: int, pad: int = 0) -> list[list[dict[str, Any]]]:
    """The quickstart's first prompts: Pi's system prompt (``pad`` more sentences of project
    guidelines, to reach the size of Pi's stock prompt), then each task's instruction."""
    guidelines = "Keep changes small and explain each one in plain words. " * pad
    system = (
        PI_COMPACT["extra_args"][1]
        + guidelines
        + "\nCurrent date: 2026-11-24\nCurrent working directory: /workspace"
    )
    return [
        [{"role": "system", "content": system}, {"role": "user", "content": task.instruction}]
        for task in load_suite()[:tasks]
        for _ in range(samples)
    ]


def run_group(
    core: EmbeddedEngineCore, conversations: list[Any], tokens: int, arrival: str, gap: float
) -> dict[str, Any]:
    params = GenerationParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    jobs = [core.prepare(m, PI_TOOLS, params) for m in conversations]
    before = core.stats()["prefill"]
    start = time.perf_counter()
    if arrival == "together":
        with core.weights_update(bump=False):  # queue all, then let them run together
            futures = [core.submit(job) for job in jobs]
    else:
        futures = []
        for job in jobs:
            futures.append(core.submit(job))
            time.sleep(gap)
    results = [f.result(timeout=600) for f in futures]
    wall = time.perf_counter() - start
    after = core.stats()["prefill"]
    latency = [
        r.timing["queue_seconds"] + r.timing["prefill_seconds"] + r.timing["decode_seconds"]
        for r in results
    ]
    return {
        "wall": wall,
        "latency": statistics.median(latency),
        "prompt": after["prompt_tokens"] - before["prompt_tokens"],
        "computed": after["computed_tokens"] - before["computed_tokens"],
        "reused": after["reused_tokens"] - before["reused_tokens"],
        "in_flight": after["reused_in_flight_tokens"] - before["reused_in_flight_tokens"],
        "held": after["held_rounds"] - before["held_rounds"],
        "ids": [r.choices[0].token_ids for r in results],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--arrival", choices=("together", "spread"), default="together")
    parser.add_argument("--gap", type=float, default=0.2, help="seconds between spread arrivals")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--pad", type=int, default=0,
        help="sentences added to the system prompt (100: ~1.6k-token prompts, several "
        "prefill chunks, as with Pi's stock prompt)",
    )  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="tiny model, 2 requests (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.tasks, args.samples, args.tokens, args.repeats = "tiny", 1, 2, 2, 1
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    conversations = group(args.tasks, args.samples, args.pad)
    print(
        f"model {loaded.name} · {len(conversations)} requests · {args.tokens} tokens each · "
        f"arrival {args.arrival} · {args.threads} thread(s) · best of {args.repeats}\n"
    )
    print(
        "| mode | prompt tokens | computed | reused (in flight) | held rounds | "
        "wall s (best, spread) | median request s (queued to done) |"
    )
    print("|---|---|---|---|---|---|---|")
    outputs = {}
    for mode in ("unshared", "shared"):
        runs = []
        for _ in range(args.repeats):
            # A fresh engine per run: nothing cached from the run before.
            core = EmbeddedEngineCore(
                loaded,
                max_active=len(conversations),
                kv_cache_entries=32 if mode == "shared" else 0,
            )
            try:
                runs.append(run_group(core, conversations, args.tokens, args.arrival, args.gap))
            finally:
                core.close()
        best = min(runs, key=lambda r: r["wall"])
        walls = [r["wall"] for r in runs]
        outputs[mode] = best["ids"]
        print(
            f"| {mode} | {best['prompt']} | {best['computed']} | {best['reused']} "
            f"({best['in_flight']}) | {best['held']} | {best['wall']:.2f} "
            f"({min(walls):.2f}-{max(walls):.2f}) | {best['latency']:.2f} |"
        )
    same = outputs["shared"] == outputs["unshared"]
    print(f"\ngreedy tokens identical with and without sharing: {same}")


if __name__ == "__main__":
    main()
