"""The embedded engine's samples, bit for bit, against those recorded from its previous K/V path.

``embedded_exact_outputs.json`` was written by the engine that prefilled each prompt into a
cache of its own and copied it into the decode batch afterwards (before prompts were prefilled
straight into their batch rows). The scenarios cover batched decode of prompts of different
lengths (short ones decode while long ones still prefill), ``n`` > 1, an early stop, prefix
reuse from the cache and from a prefill in flight, a second turn, and a weights update.

Float results pin the CPU kernels, so logprobs are compared bit for bit where the recording's
torch version and CPU capability are this machine's, and to 1e-5 elsewhere; ids always exactly.
``python tests/unit/engines/test_embedded_exactness.py`` rewrites the recording.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from polar.engines.embedded.core import EmbeddedEngineCore, GenerationResult
from polar.engines.embedded.job import Job
from polar.engines.embedded.loader import load_model
from polar.engines.embedded.sampling import GenerationParams

RECORDING = Path(__file__).with_name("embedded_exact_outputs.json")
SYSTEM = {"role": "system", "content": "You are a coding agent. Use the tools on files. " * 12}


def platform() -> dict[str, str]:
    return {"torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability()}


def sampled(params: GenerationParams, seed: int) -> GenerationParams:
    return GenerationParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        seed=seed,
        n=params.n,
        stop=params.stop,
        ignore_eos=params.ignore_eos,
        top_logprobs=params.top_logprobs,
    )


def together(core: EmbeddedEngineCore, jobs: list[Job]) -> list[GenerationResult]:
    """Queue every job first, so they all start in the same scheduler round (deterministic):
    the scheduler takes new work under this lock (re-entrant, so submit can take it too)."""
    with core._cond:
        futures = [core.submit(job) for job in jobs]
    return [future.result(timeout=120) for future in futures]


def record(results: list[GenerationResult]) -> list[dict[str, Any]]:
    return [
        {
            "reused": r.timing["reused_prefix_tokens"],
            "choices": [
                {
                    "ids": c.token_ids,
                    "logprobs": [float(x).hex() for x in c.logprobs],
                    "finish": c.finish_reason,
                }
                for c in r.choices
            ],
        }
        for r in results
    ]


def ids_of(n: int, seed: int) -> list[int]:
    return torch.randint(3, 40_000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def scenarios() -> dict[str, Any]:
    """Every scenario's results, in order, on a fresh tiny model (the last one changes it)."""
    core = EmbeddedEngineCore(load_model("tiny"), prefill_chunk=16, max_active=8)
    base = GenerationParams(max_tokens=24, temperature=0.8, ignore_eos=True)
    out: dict[str, Any] = {}
    try:
        # Longest prompt first: the short ones finish prefill and decode while it still reads.
        lengths = [150, 20, 90, 41, 64]
        jobs = [core.prepare_ids(ids_of(n, i), sampled(base, i)) for i, n in enumerate(lengths)]
        n3 = GenerationParams(
            max_tokens=16, temperature=1.0, seed=5, n=3, ignore_eos=True, top_logprobs=2
        )
        jobs.append(core.prepare_ids(ids_of(33, 9), n3))
        jobs.append(core.prepare_ids(ids_of(17, 11), GenerationParams(max_tokens=1, seed=1)))
        jobs.append(
            core.prepare(
                [{"role": "user", "content": "Say something short."}],
                params=GenerationParams(max_tokens=40, temperature=0.9, seed=8, stop=("e",)),
            )
        )
        out["batched"] = record(together(core, jobs))
        # A group sharing a long system prompt: one reads it, the others wait and copy it from
        # its prefill in flight (nothing cached shares more).
        core.prefix_cache.clear()
        group = [
            core.prepare([SYSTEM, {"role": "user", "content": q}], params=sampled(base, 20 + i))
            for i, q in enumerate(["Add 2 and 3.", "Write hello.", "List primes.", "Count."])
        ]
        first = together(core, group)
        out["group"] = record(first)
        # Second turns extend the first turns: their prefixes come from the prefix cache.
        turns = []
        for i, result in enumerate(first):
            text = result.choices[0].text
            messages = [
                SYSTEM,
                {"role": "user", "content": "Add 2 and 3."},
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"And then {i}?"},
            ]
            turns.append(core.prepare(messages, params=sampled(base, 30 + i)))
        out["second_turn"] = record(together(core, turns))
        with core.weights_update() as module, torch.no_grad():
            for parameter in module.parameters():
                parameter.mul_(1.01)
        again = [
            core.prepare_ids(ids_of(n, 40 + i), sampled(base, 40 + i))
            for i, n in enumerate([70, 25, 70])
        ]
        out["after_update"] = record(together(core, again))
        out["stats"] = dict(core.stats()["prefill"])
    finally:
        core.close()
    return out


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_samples_match_the_recording_of_the_previous_kv_path(one_thread: None) -> None:
    recorded = json.loads(RECORDING.read_text())
    got = scenarios()
    exact = recorded["platform"] == platform()
    assert got["stats"] == recorded["outputs"]["stats"]  # the same work: prefill and reuse
    for name, results in recorded["outputs"].items():
        if name == "stats":
            continue
        assert len(got[name]) == len(results), name
        for i, (mine, theirs) in enumerate(zip(got[name], results, strict=True)):
            assert mine["reused"] == theirs["reused"], (name, i)
            for a, b in zip(mine["choices"], theirs["choices"], strict=True):
                assert a["ids"] == b["ids"] and a["finish"] == b["finish"], (name, i)
                if exact:
                    assert a["logprobs"] == b["logprobs"], (name, i)
                else:
                    mine_lp = torch.tensor([float.fromhex(x) for x in a["logprobs"]])
                    theirs_lp = torch.tensor([float.fromhex(x) for x in b["logprobs"]])
                    torch.testing.assert_close(mine_lp, theirs_lp, atol=1e-5, rtol=0)


if __name__ == "__main__":
    torch.set_num_threads(1)
    RECORDING.write_text(json.dumps({"platform": platform(), "outputs": scenarios()}) + "\n")
    sys.exit(0)
