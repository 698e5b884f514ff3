"""Benchmark the embedded engine on CPU: throughput against transformers, and prefix reuse.

1. Throughput: prefill and decode tokens/s of the engine and of plain ``transformers``
   ``generate()`` on the same model, same prompt, same greedy settings, in the same run
   (engine and baseline interleaved so machine noise hits both; the best of ``--repeats``,
   since on a shared machine noise only ever adds time).
2. Concurrency: N requests at once (1, 4, 8), each decoding the same number of tokens; the
   engine decodes them as one batch, so aggregate tokens/s grows with N.
3. Agent session: a 20-turn session in the shape of a coding agent (a long system prompt with
   tool definitions, then turns of a short assistant reply and a tool result). Turn ``k`` is
   timed with the prefix cache (all turns in order, as a session runs) and without it (every
   turn pays its full prompt; turns are independent then, so only the reported ones run). Both
   runs send identical prompts and generate the same number of tokens; each is done
   ``--session-repeats`` times and the best time per turn is reported.

    python bench/engine.py                    # SmolLM2-135M-Instruct, 2 threads
    python bench/engine.py --model tiny --quick
    python bench/engine.py --smoke            # tiny model, tiny sizes: seconds (CI)
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch

from polar.engines.embedded import EmbeddedEngineCore, GenerationParams, load_model

REPORTED_TURNS = (1, 5, 10, 15, 20)
PARAGRAPH = (
    "The engine keeps the keys and values of every prompt it has seen, so that the next turn of "
    "an agent session only pays for the tokens that are new. Each tool result is appended to a "
    "growing conversation, and the model is asked to continue from where it stopped. "
)


def tool_definitions() -> list[dict[str, Any]]:
    """A coding agent's tools, with descriptions long enough to give a ~1.5k-token prompt."""
    names = ["read", "write", "edit", "bash", "grep", "find", "ls", "test"]
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"The {name} tool. " + PARAGRAPH * 2,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "A path in the workspace."},
                        "argument": {"type": "string", "description": f"What {name} acts on."},
                    },
                    "required": ["path"],
                },
            },
        }
        for name in names
    ]


def tool_result(turn: int) -> str:
    lines = [
        f"src/module_{turn}_{i}.py: {i * 37 % 101} lines, last changed at step {turn}"
        for i in range(8)
    ]
    return "\n".join(lines)


def timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def throughput(model: str, prompt_tokens: int, decode_tokens: int, repeats: int) -> list[str]:
    core = EmbeddedEngineCore(load_model(model), kv_cache_entries=0)
    messages = [{"role": "user", "content": ""}]
    while len(core.render(messages).ids) < prompt_tokens:
        messages[0]["content"] += PARAGRAPH
    prompt = core.render(messages).ids
    params = GenerationParams(max_tokens=decode_tokens, temperature=0, ignore_eos=True)
    module = core.module
    ids = torch.tensor([prompt])

    def hf(new_tokens: int) -> Any:
        with torch.inference_mode():
            return module.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=core.tokenizer.eos_token_id,
            )

    hf(2)  # warm up both paths once
    core.generate_sync(messages, params=GenerationParams(max_tokens=2, temperature=0))
    engine_prefill, engine_decode, hf_prefill, hf_total = [], [], [], []
    for _ in range(repeats):
        timing = core.generate_sync(messages, params=params).timing
        engine_prefill.append(float(timing["prefill_seconds"]))
        engine_decode.append(float(timing["decode_seconds"]))
        hf_prefill.append(timed(lambda: hf(1)))
        hf_total.append(timed(lambda: hf(decode_tokens)))
    core.close()
    e_pre, e_dec = min(engine_prefill), min(engine_decode)
    h_pre = min(hf_prefill)
    h_dec = min(hf_total) - h_pre
    steps = decode_tokens - 1  # forward passes after the one that ends prefill
    rows = [
        f"Prompt {len(prompt)} tokens, {decode_tokens} generated (greedy), best of {repeats}.",
        "",
        "| | prefill tok/s | decode tok/s | prefill s | decode s |",
        "|---|---|---|---|---|",
        f"| embedded engine | {len(prompt) / e_pre:.0f} | {steps / e_dec:.1f} | {e_pre:.2f} | {e_dec:.2f} |",
        f"| transformers generate() | {len(prompt) / h_pre:.0f} | {steps / h_dec:.1f} | {h_pre:.2f} | {h_dec:.2f} |",
        f"| ratio (engine / generate) | {h_pre / e_pre:.2f}x | {h_dec / e_dec:.2f}x | | |",
    ]
    return rows


def concurrency(model: str, gen_tokens: int, levels: tuple[int, ...] = (1, 4, 8)) -> list[str]:
    core = EmbeddedEngineCore(load_model(model), kv_cache_entries=0, max_active=max(levels))
    params = GenerationParams(max_tokens=gen_tokens, temperature=0.8, seed=1, ignore_eos=True)
    rows = [
        f"{gen_tokens} tokens per request, ~230-token prompts, all submitted at once (prefill "
        "included in the wall time).",
        "",
        "| concurrent requests | wall s | aggregate tok/s | speedup over 1 |",
        "|---|---|---|---|",
    ]
    base = 0.0
    for level in levels:
        jobs = [
            core.prepare(
                [{"role": "user", "content": f"Tell me about the number {i}. " * 20}], params=params
            )
            for i in range(level)
        ]
        started = time.perf_counter()
        with core.weights_update(bump=False):  # hold them back so they start together
            futures = [core.submit(job) for job in jobs]
        for future in futures:
            future.result()
        wall = time.perf_counter() - started
        rate = level * gen_tokens / wall
        base = base or rate
        rows.append(f"| {level} | {wall:.2f} | {rate:.1f} | {rate / base:.1f}x |")
    core.close()
    return rows


def session_transcript(
    core: EmbeddedEngineCore, turns: int, gen_tokens: int
) -> list[dict[str, Any]]:
    """Run the session with prefix reuse; return each turn's messages and its timing."""
    tools = tool_definitions()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools to finish the task."},
        {"role": "user", "content": "Find the module with the most lines and summarise it."},
    ]
    params = GenerationParams(max_tokens=gen_tokens, temperature=0, ignore_eos=True)
    record = []
    for turn in range(1, turns + 1):
        started = time.perf_counter()
        result = core.generate_sync(messages, tools, params)
        elapsed = time.perf_counter() - started
        record.append(
            {
                "turn": turn,
                "messages": list(messages),
                "prompt_tokens": len(result.prompt_ids),
                "seconds": elapsed,
                "reused": result.timing["reused_prefix_tokens"],
            }
        )
        messages = [
            *messages,
            {"role": "assistant", "content": result.choices[0].text},
            {"role": "tool", "tool_call_id": f"call_{turn}", "content": tool_result(turn)},
        ]
    return record


def agent_session(model: str, turns: int, gen_tokens: int, repeats: int) -> list[str]:
    loaded = load_model(model)
    runs = []
    for _ in range(repeats):
        with_cache = EmbeddedEngineCore(loaded)
        runs.append(session_transcript(with_cache, turns, gen_tokens))
        with_cache.close()
    transcript = [min(entries, key=lambda e: e["seconds"]) for entries in zip(*runs, strict=True)]
    without = EmbeddedEngineCore(loaded, kv_cache_entries=0)
    params = GenerationParams(max_tokens=gen_tokens, temperature=0, ignore_eos=True)
    tools = tool_definitions()
    growth = (transcript[-1]["prompt_tokens"] - transcript[0]["prompt_tokens"]) / max(1, turns - 1)
    rows = [
        f"{turns}-turn session, {gen_tokens} generated tokens per turn (greedy), tools in the "
        f"system prompt; each turn adds {growth:.0f} prompt tokens (its reply and a tool result).",
        "",
        "| turn | prompt tokens | reused tokens | with prefix reuse s | without s | speedup |",
        "|---|---|---|---|---|---|",
    ]
    for turn in [t for t in REPORTED_TURNS if t <= turns]:
        entry = transcript[turn - 1]
        cold = min(
            timed(lambda e=entry: without.generate_sync(e["messages"], tools, params))
            for _ in range(repeats)
        )
        rows.append(
            f"| {turn} | {entry['prompt_tokens']} | {entry['reused']} | {entry['seconds']:.2f} "
            f"| {cold:.2f} | {cold / entry['seconds']:.1f}x |"
        )
    without.close()
    total = min(sum(e["seconds"] for e in run) for run in runs)
    rows.append("")
    rows.append(f"Whole session with prefix reuse: {total:.1f} s for {turns} turns (best run).")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--gen-tokens", type=int, default=32)
    parser.add_argument("--session-repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="1 repeat, 5 turns")
    parser.add_argument("--smoke", action="store_true", help="tiny model, tiny sizes (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.prompt_tokens, args.decode_tokens, args.gen_tokens = "tiny", 32, 4, 4
        args.repeats, args.session_repeats, args.turns = 1, 1, 2
    elif args.quick:
        args.repeats, args.session_repeats, args.turns = 1, 1, 5
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    print(
        f"# Embedded engine: {args.model}, {args.threads} threads, fp32, load average {load:.1f}\n"
    )
    print("\n".join(throughput(args.model, args.prompt_tokens, args.decode_tokens, args.repeats)))
    print()
    print("\n".join(concurrency(args.model, args.decode_tokens)))
    print()
    print("\n".join(agent_session(args.model, args.turns, args.gen_tokens, args.session_repeats)))
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
