"""KV caches of the embedded engine: the batch of rows, and the bounded LRU prefix cache."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import DynamicCache

from polar.engines.embedded.kv_cache import (
    BatchCache,
    PrefixCache,
    cache_keyword,
    common_prefix_length,
    supports_batch_cache,
)
from polar.engines.embedded.loader import LoadedModel, load_model


@pytest.fixture(scope="module")
def tiny() -> Iterator[LoadedModel]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model("tiny")
    torch.set_num_threads(threads)


def kv(length: int, fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    base = torch.arange(length, dtype=torch.float32).view(1, 1, length, 1).expand(1, 2, length, 4)
    return base + fill, -(base + fill)


def cache_with(tokens: list[int], layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys/values of ``tokens`` as a batch row holds them (views, per layer)."""
    batch = BatchCache(layers, heads=2, head_dim=4, dtype=torch.float32)
    row = batch.reserve(1, len(tokens) + 4)
    batch.load(row, [kv(len(tokens))] * layers, len(tokens))
    return batch.prefix(row, len(tokens))


def tiny_batch(tiny: LoadedModel) -> BatchCache:
    config = tiny.module.config
    return BatchCache(2, config.num_key_value_heads, config.head_dim, torch.float32)


def prefill(tiny: LoadedModel, batch: BatchCache, row: int, ids: list[int]) -> torch.Tensor:
    """Run ``ids`` into ``row`` (after what it holds); the last position's logits."""
    cache = batch.row_cache(row)
    logits = tiny.module(
        input_ids=torch.tensor([ids]), use_cache=True, **{cache_keyword(tiny.module): cache}
    ).logits[0, -1]
    batch.extend(row, len(ids))
    return logits


def test_a_row_prefilled_in_chunks_gives_the_logits_of_transformers_dynamic_cache(
    tiny: LoadedModel,
) -> None:
    ids = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365]
    batch = tiny_batch(tiny)
    batch.reserve(1, 3)  # a neighbour, so the row is not the first
    row = batch.reserve(1, len(ids))
    with torch.inference_mode():
        dynamic = DynamicCache()
        tiny.module(input_ids=torch.tensor([ids[:6]]), **{cache_keyword(tiny.module): dynamic})
        prefill(tiny, batch, row, ids[:6])
        for i in range(6, 10):
            a = tiny.module(
                input_ids=torch.tensor([ids[i : i + 1]]), **{cache_keyword(tiny.module): dynamic}
            ).logits[0, -1]
            b = prefill(tiny, batch, row, ids[i : i + 1])
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert batch.lengths.tolist() == [0, 10]
    assert not batch.batch_layers[0].key_buf[0].any()  # the neighbour row is untouched


def test_batched_rows_of_different_lengths_match_single_sequence_logits(
    tiny: LoadedModel,
) -> None:
    prompts = [[1, 9690, 198, 2683, 359, 253, 5356], [1, 4093, 198], [1, 520, 9531, 198, 44, 45]]
    following = [[5646, 11173, 3365], [19556, 665, 2], [46, 47, 48]]
    batch = tiny_batch(tiny)
    with torch.inference_mode():
        rows = [batch.reserve(1, len(prompt) + 1) for prompt in prompts]
        for row, prompt in zip(rows, prompts, strict=True):  # each prefilled into its row
            prefill(tiny, batch, row, prompt)
            batch.arrange(list(range(batch.rows)), decoding=row + 1)
        assert batch.lengths.tolist() == [7, 3, 6] and batch.decoding == 3
        for step in range(3):
            batch.ensure_room(1)
            positions, mask = batch.step_inputs()
            ids = torch.tensor([[f[step]] for f in following])
            logits = tiny.module(
                input_ids=ids,
                position_ids=positions,
                attention_mask=mask,
                **{cache_keyword(tiny.module): batch},
            ).logits[:, -1]
            batch.advance()
            for row, (prompt, more) in enumerate(zip(prompts, following, strict=True)):
                full = torch.tensor([prompt + more[: step + 1]])
                expected = tiny.module(input_ids=full).logits[0, -1]
                torch.testing.assert_close(logits[row], expected, rtol=0, atol=1e-5)
        assert batch.capacity >= 10
        batch.arrange([2, 0], decoding=2)  # row 1 finished; the others move up, in that order
        assert batch.lengths.tolist() == [9, 10]
        first = batch.prefix(1, 10)[0][0]
        expected_batch = tiny_batch(tiny)
        prefill(tiny, expected_batch, expected_batch.reserve(1, 10), prompts[0] + following[0])
        torch.testing.assert_close(first, expected_batch.prefix(0, 10)[0][0], rtol=0, atol=1e-5)


def test_a_decode_step_leaves_rows_still_reading_alone(tiny: LoadedModel) -> None:
    batch = tiny_batch(tiny)
    with torch.inference_mode():
        decoding, reading = batch.reserve(1, 8), batch.reserve(1, 8)
        prefill(tiny, batch, decoding, [1, 9690, 198])
        prefill(tiny, batch, reading, [1, 4093])
        batch.arrange([0, 1], decoding=1)
        before = batch.prefix(reading, 8)[0][0].clone()
        positions, mask = batch.step_inputs()
        tiny.module(
            input_ids=torch.tensor([[44]]),
            position_ids=positions,
            attention_mask=mask,
            **{cache_keyword(tiny.module): batch},
        )
        batch.advance()
    assert batch.lengths.tolist() == [4, 2]
    assert torch.equal(batch.prefix(reading, 8)[0][0], before)


def test_a_request_with_several_choices_fans_its_prompt_out() -> None:
    batch = BatchCache(1, heads=2, head_dim=4, dtype=torch.float32)
    first = batch.reserve(3, 6)
    batch.load(first, [kv(4)], 4)
    batch.fan_out(first, 3)
    assert batch.lengths.tolist() == [4, 4, 4]
    for row in range(3):
        torch.testing.assert_close(batch.prefix(row, 4)[0][0], kv(4)[0])


def test_rows_grow_one_layer_at_a_time_and_shrink_when_rows_leave() -> None:
    batch = BatchCache(2, heads=2, head_dim=4, dtype=torch.float32)
    batch.reserve(1, 10)
    assert batch.capacity == 10  # a reservation takes exactly what it needs
    batch.load(0, [kv(10)] * 2, 10)
    batch.arrange([0], decoding=1)
    batch.ensure_room(1)
    assert batch.capacity == 10 + 256  # decode grows by at least MIN_GROWTH
    batch.reserve(2, 700)
    assert batch.capacity == 700
    batch.arrange([0], decoding=1)  # the long ones left
    assert batch.capacity == 10 + 256 and batch.batch_layers[1].key_buf.shape[:3] == (1, 2, 266)
    torch.testing.assert_close(batch.prefix(0, 10)[1][0], kv(10)[0])


def test_batch_buffers_hold_no_nan_beyond_row_lengths() -> None:
    batch = BatchCache(1, heads=2, head_dim=4, dtype=torch.float32)
    batch.reserve(2, 5)
    batch.load(0, [kv(3)], 3)
    batch.reserve(1, 601)
    batch.load(2, [kv(1)], 1)
    layer = batch.batch_layers[0]
    assert torch.isfinite(layer.key_buf).all() and torch.isfinite(layer.value_buf).all()
    assert layer.key_buf.shape[:3] == (3, 2, batch.capacity) and batch.capacity >= 601
    torch.testing.assert_close(layer.key_buf[0, :, :3], kv(3)[0][0])


def test_lookup_finds_longest_common_prefix_within_limit() -> None:
    cache = PrefixCache(max_entries=4)
    cache.store([1, 2, 3, 4, 5], cache_with([1, 2, 3, 4, 5]), policy_version=0)
    cache.store([1, 2, 9], cache_with([1, 2, 9]), policy_version=0)
    match = cache.lookup([1, 2, 3, 4, 7, 8], policy_version=0, limit=5)
    assert match is not None and match.length == 4
    assert match.entry.tokens.tolist() == [1, 2, 3, 4, 5]
    limited = cache.lookup([1, 2, 3, 4, 5, 6], policy_version=0, limit=3)
    assert limited is not None and limited.length == 3
    assert cache.lookup([7, 1, 2], policy_version=0, limit=3) is None
    assert (cache.hits, cache.misses, cache.reused_tokens) == (2, 1, 7)


def test_match_length_plans_without_counting_or_reordering() -> None:
    cache = PrefixCache(max_entries=2)
    cache.store([1, 2, 3, 4], cache_with([1, 2, 3, 4]), policy_version=0)
    cache.store([5, 6], cache_with([5, 6]), policy_version=0)
    assert cache.match_length([1, 2, 3, 9], policy_version=0, limit=8) == 3
    assert cache.match_length([1, 2, 3, 4, 5], policy_version=0, limit=2) == 2
    assert cache.match_length([1, 2], policy_version=1, limit=2) == 0
    assert cache.match_length([7], policy_version=0, limit=1) == 0
    assert (cache.hits, cache.misses, cache.reused_tokens) == (0, 0, 0)
    cache.store([8], cache_with([8]), policy_version=0)  # [1, 2, 3, 4] is still the oldest
    assert cache.match_length([1, 2], policy_version=0, limit=2) == 0


def test_entries_of_another_policy_version_are_never_reused() -> None:
    cache = PrefixCache(max_entries=4)
    cache.store([1, 2, 3], cache_with([1, 2, 3]), policy_version=0)
    assert cache.lookup([1, 2, 3, 4], policy_version=1, limit=3) is None


def test_a_turn_that_extends_an_entry_replaces_it() -> None:
    cache = PrefixCache(max_entries=4)
    cache.store([1, 2, 3], cache_with([1, 2, 3]), policy_version=0)
    cache.store([1, 2, 3, 4, 5], cache_with([1, 2, 3, 4, 5]), policy_version=0)
    assert len(cache) == 1
    assert cache.nbytes == 2 * 2 * 5 * 2 * 4 * 4  # layers * (k, v) * tokens * heads * dim * fp32


def test_lru_eviction_by_entries_and_by_bytes() -> None:
    cache = PrefixCache(max_entries=2)
    cache.store([1], cache_with([1]), 0)
    cache.store([2], cache_with([2]), 0)
    assert cache.lookup([1, 5], 0, limit=1) is not None  # 1 is now most recent
    cache.store([3], cache_with([3]), 0)
    assert cache.lookup([2, 5], 0, limit=1) is None
    assert cache.lookup([1, 5], 0, limit=1) is not None

    per_token = 2 * 2 * 2 * 4 * 4
    small = PrefixCache(max_entries=10, max_bytes=3 * per_token)
    small.store([1, 1], cache_with([1, 1]), 0)
    small.store([2, 2], cache_with([2, 2]), 0)
    assert len(small) == 1 and small.nbytes == 2 * per_token
    small.store([3, 3, 3, 3], cache_with([3, 3, 3, 3]), 0)  # larger than the whole budget
    assert len(small) == 1


def test_zero_entries_disables_the_cache() -> None:
    cache = PrefixCache(max_entries=0)
    cache.store([1, 2], cache_with([1, 2]), 0)
    assert len(cache) == 0 and cache.lookup([1, 2, 3], 0, limit=2) is None


def test_reusing_an_entry_copies_it_so_the_entry_never_changes() -> None:
    cache = PrefixCache(max_entries=2)
    cache.store([1, 2, 3, 4], cache_with([1, 2, 3, 4]), 0)
    match = cache.lookup([1, 2, 3, 9], 0, limit=3)
    assert match is not None
    before = [(k.clone(), v.clone()) for k, v in match.entry.layers]
    work = BatchCache(2, heads=2, head_dim=4, dtype=torch.float32)
    row = work.reserve(1, 8)
    work.load(row, match.entry.layers, match.length)
    assert work.lengths.tolist() == [3]
    for layer in work.batch_layers:
        layer.key_buf[row, :, 3] = 100.0
    for (k, v), (k0, v0) in zip(match.entry.layers, before, strict=True):
        assert torch.equal(k, k0) and torch.equal(v, v0)
    assert float(work.batch_layers[0].key_buf[0, 0, 3, 0]) == 100.0


def test_a_replaced_entry_is_dropped_before_its_successor_is_copied() -> None:
    """The cache never holds a prompt twice, nor more than its bytes, even while storing."""
    cache = PrefixCache(max_entries=4, max_bytes=3 * 2 * 2 * 2 * 4 * 4)  # 3 tokens, 2 layers
    cache.store([1, 2], cache_with([1, 2]), 0)
    held: list[int] = []
    original = torch.Tensor.clone

    def clone(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        held.append(cache.nbytes)
        return original(tensor, *args, **kwargs)

    torch.Tensor.clone = clone  # type: ignore[method-assign,assignment]
    try:
        cache.store([1, 2, 3], cache_with([1, 2, 3]), 0)
    finally:
        torch.Tensor.clone = original  # type: ignore[method-assign]
    assert held and max(held) == 0  # the two-token entry was gone before any copy
    assert len(cache) == 1 and cache.nbytes == 3 * 2 * 2 * 2 * 4 * 4


def test_only_full_attention_models_use_the_batch_cache(tiny: LoadedModel) -> None:
    config = tiny.module.config
    assert supports_batch_cache(config)
    sliding = type(config).from_dict({**config.to_dict(), "layer_types": ["sliding_attention"] * 2})
    assert not supports_batch_cache(sliding)


@given(st.lists(st.integers(0, 3), max_size=30), st.lists(st.integers(0, 3), max_size=30))
def test_common_prefix_length_matches_its_definition(a: list[int], b: list[int]) -> None:
    n = common_prefix_length(np.array(a, dtype=np.int64), np.array(b, dtype=np.int64))
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]
