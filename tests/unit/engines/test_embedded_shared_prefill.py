"""Concurrent requests with a common prompt prefix share its prefill (the embedded engine)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from polar.engines.embedded.core import EmbeddedEngineCore, GenerationResult
from polar.engines.embedded.loader import LoadedModel, load_model
from polar.engines.embedded.sampling import GenerationParams

SYSTEM = {"role": "system", "content": "You are a coding agent. Use the tools on files. " * 12}
QUESTIONS = ["Add 2 and 3.", "What is the capital of France?", "Write hello.", "List primes."]
GROUP = [[SYSTEM, {"role": "user", "content": q}] for q in QUESTIONS]
GREEDY = GenerationParams(max_tokens=12, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny() -> Iterator[LoadedModel]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model("tiny")
    torch.set_num_threads(threads)


def run_together(
    core: EmbeddedEngineCore, conversations: list[Any], params: GenerationParams = GREEDY
) -> list[GenerationResult]:
    """Queue every request first, so they all arrive in the same scheduler round."""
    jobs = [core.prepare(messages, params=params) for messages in conversations]
    with core.weights_update(bump=False):
        futures = [core.submit(job) for job in jobs]
    return [future.result(timeout=60) for future in futures]


def teacher_forced(core: EmbeddedEngineCore, result: GenerationResult) -> torch.Tensor:
    sampled = result.choices[0].token_ids
    ids = torch.tensor([result.prompt_ids + sampled])
    with torch.inference_mode():
        logits = core.module(input_ids=ids).logits[0].float()
    steps = torch.log_softmax(logits[len(result.prompt_ids) - 1 : -1], dim=-1)
    return steps.gather(-1, torch.tensor(sampled)[:, None]).squeeze(-1)


def shared_length(results: list[GenerationResult]) -> int:
    first = results[0].prompt_ids
    n = 0
    while all(len(r.prompt_ids) > n and r.prompt_ids[n] == first[n] for r in results):
        n += 1
    return n


@pytest.mark.parametrize("chunk", [512, 16])
def test_a_group_computes_its_common_prefix_once_with_the_same_outputs(
    tiny: LoadedModel, chunk: int
) -> None:
    """One prefill chunk per prompt (the leader's prompt lands in the cache) or many (the
    others copy the leader's keys and values while it is still reading): either way the
    common prefix is computed once, and greedy outputs equal those without any sharing."""
    alone = EmbeddedEngineCore(tiny, kv_cache_entries=0, prefill_chunk=chunk)
    shared = EmbeddedEngineCore(tiny, prefill_chunk=chunk)
    try:
        baseline = run_together(alone, GROUP)
        results = run_together(shared, GROUP)
        stats, base_stats = shared.stats()["prefill"], alone.stats()["prefill"]
        for result in results:
            assert (
                torch.max(
                    torch.abs(
                        torch.tensor(result.choices[0].logprobs) - teacher_forced(shared, result)
                    )
                )
                < 1e-4
            )
    finally:
        alone.close()
        shared.close()
    common = shared_length(results)
    total = sum(len(r.prompt_ids) for r in results)
    assert common > 100
    assert base_stats["computed_tokens"] == base_stats["prompt_tokens"] == total
    assert base_stats["reused_tokens"] == 0
    assert stats["prompt_tokens"] == total and stats["requests"] == len(GROUP)
    assert stats["computed_tokens"] == total - (len(GROUP) - 1) * common
    assert stats["reused_tokens"] == (len(GROUP) - 1) * common
    if chunk < common:  # the others copied the leader's prefix while it was still reading
        assert stats["reused_in_flight_tokens"] > 0
    else:  # they started in the leader's round, from the prompt it had just stored
        assert stats["held_rounds"] == 0 and stats["reused_in_flight_tokens"] == 0
    assert [r.timing["reused_prefix_tokens"] for r in results] == [0] + [common] * 3
    for mine, theirs in zip(results, baseline, strict=True):
        assert mine.prompt_ids == theirs.prompt_ids
        assert mine.choices[0].token_ids == theirs.choices[0].token_ids
        # A prompt read in different pieces rounds differently in float32, as does a decode
        # step in a batch of another size: equal to float rounding, not necessarily bitwise.
        got, want = torch.tensor(mine.choices[0].logprobs), torch.tensor(theirs.choices[0].logprobs)
        assert torch.max(torch.abs(got - want)) < 1e-5


def test_the_first_token_after_a_shared_prefix_matches_a_full_prefill(tiny: LoadedModel) -> None:
    """What prefill alone decides (the first token and its logprob), with and without sharing."""
    first_only = GenerationParams(max_tokens=1, temperature=0)
    alone = EmbeddedEngineCore(tiny, kv_cache_entries=0)
    shared = EmbeddedEngineCore(tiny)
    try:
        baseline = run_together(alone, GROUP, first_only)
        results = run_together(shared, GROUP, first_only)
    finally:
        alone.close()
        shared.close()
    assert [r.timing["reused_prefix_tokens"] > 0 for r in results] == [False, True, True, True]
    for mine, theirs in zip(results, baseline, strict=True):
        assert mine.choices[0].token_ids == theirs.choices[0].token_ids
        assert abs(mine.choices[0].logprobs[0] - theirs.choices[0].logprobs[0]) < 1e-5


def test_a_single_request_leaves_its_prompt_for_the_next_arrival(tiny: LoadedModel) -> None:
    """n == 1 stores the prompt at the end of prefill, before its generation ends."""
    core = EmbeddedEngineCore(tiny)
    try:
        long = GenerationParams(max_tokens=200, temperature=0, ignore_eos=True)
        first = core.submit(core.prepare(GROUP[0], params=long))
        while core.stats()["batched_decode"]["steps"] == 0:
            pass  # until the first request decodes: its prefill is over
        second = core.submit(core.prepare(GROUP[1], params=GREEDY)).result(timeout=60)
        assert not first.done()
        assert second.timing["reused_prefix_tokens"] == shared_length([first.result(60), second])
    finally:
        core.close()


def test_prompts_sharing_little_start_at_once(tiny: LoadedModel) -> None:
    core = EmbeddedEngineCore(tiny)
    try:
        different = [
            [{"role": "user", "content": "Short question?"}],
            [{"role": "system", "content": "Be terse. " * 40}, {"role": "user", "content": "Hi"}],
        ]
        results = run_together(core, different)
        assert core.stats()["prefill"]["held_rounds"] == 0
        assert all(r.timing["reused_prefix_tokens"] < 32 for r in results)
    finally:
        core.close()


def test_a_weights_update_drops_shared_prefixes(tiny: LoadedModel) -> None:
    core = EmbeddedEngineCore(tiny)
    try:
        run_together(core, GROUP)
        with core.weights_update() as module, torch.no_grad():
            module.model.norm.weight.mul_(1.5)
        after = run_together(core, GROUP)
        assert after[0].timing["reused_prefix_tokens"] == 0  # nothing from the old weights
        assert all(r.policy_version == 1 for r in after)
        for result in after:
            got = torch.tensor(result.choices[0].logprobs)
            assert torch.max(torch.abs(got - teacher_forced(core, result))) < 1e-4
    finally:
        core.close()


def test_a_prefill_of_an_older_policy_version_is_never_copied(tiny: LoadedModel) -> None:
    """A request still reading its prompt when the version was bumped out of band is no donor
    (and nobody waits for it)."""
    core = EmbeddedEngineCore(tiny, prefill_chunk=16)
    try:
        old = core.prepare(GROUP[0], params=GREEDY)
        old.begun, old.version = True, core.policy_version
        assert core._start(old, [old]) == 0
        assert old.first_row is not None
        with torch.inference_mode():
            core._forward(torch.tensor([old.prompt.ids[:64]]), core._batch.row_cache(old.first_row))
        core._batch.extend(old.first_row, 64)
        old.position = 64
        core.bump_policy_version()
        new = core.prepare(GROUP[1], params=GREEDY)
        assert not core._waits(new, [old, new])
        new.version = core.policy_version
        assert core._start(new, [old, new]) == 0
        old.version = core.policy_version  # the same job under the current version is a donor
        again = core.prepare(GROUP[1], params=GREEDY)
        assert core._waits(again, [old, again])
        again.version = core.policy_version
        assert core._start(again, [old, again]) == 64
        assert again.first_row is not None
        donor, copy = core._batch.prefix(old.first_row, 64), core._batch.prefix(again.first_row, 64)
        assert all(torch.equal(a[0], b[0]) for a, b in zip(donor, copy, strict=True))
    finally:
        core.close()
