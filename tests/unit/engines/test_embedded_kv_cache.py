"""KV caches of the embedded engine: the buffer layer, and the bounded LRU prefix cache."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import DynamicCache

from polar.engines.embedded.kv_cache import (
    BatchCache,
    BufferCache,
    BufferLayer,
    PrefixCache,
    common_prefix_length,
    load_prefix,
    supports_buffer_cache,
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
    """Keys/values of ``tokens`` as a prefill cache holds them (views, per layer)."""
    cache = BufferCache(layers, capacity=4)
    for layer in cache.buffers:
        layer.update(*kv(len(tokens)))
    return cache.prefix(len(tokens))


def test_buffer_layer_grows_and_keeps_every_position() -> None:
    layer = BufferLayer(capacity=3)
    keys, values = layer.update(*kv(2))
    assert keys.shape[-2] == 2
    for step in range(2, 600):
        keys, values = layer.update(*(t[:, :, -1:] for t in kv(step + 1)))
    assert layer.get_seq_length() == 600 and layer.capacity >= 600
    expected_keys, expected_values = kv(600)
    torch.testing.assert_close(keys, expected_keys)
    torch.testing.assert_close(values, expected_values)
    layer.crop(-100)
    assert layer.get_seq_length() == 500 and layer.keys is not None
    assert layer.keys.shape[-2] == 500


def test_buffer_cache_gives_the_same_logits_as_transformers_dynamic_cache(
    tiny: LoadedModel,
) -> None:
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365]])
    with torch.inference_mode():
        dynamic, buffered = DynamicCache(), BufferCache(2, capacity=4)
        for cache in (dynamic, buffered):
            tiny.module(input_ids=ids[:, :6], past_key_values=cache, use_cache=True)
        for i in range(6, 10):
            a = tiny.module(input_ids=ids[:, i : i + 1], past_key_values=dynamic).logits
            b = tiny.module(input_ids=ids[:, i : i + 1], past_key_values=buffered).logits
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_batched_rows_of_different_lengths_match_single_sequence_logits(
    tiny: LoadedModel,
) -> None:
    prompts = [[1, 9690, 198, 2683, 359, 253, 5356], [1, 4093, 198], [1, 520, 9531, 198, 44, 45]]
    following = [[5646, 11173, 3365], [19556, 665, 2], [46, 47, 48]]
    config = tiny.module.config
    batch = BatchCache(2, config.num_key_value_heads, config.head_dim, torch.float32)
    with torch.inference_mode():
        for prompt in prompts:  # each prefilled alone, then joins the batch
            single = BufferCache(2, capacity=len(prompt))
            tiny.module(input_ids=torch.tensor([prompt]), past_key_values=single)
            batch.add(single.prefix(len(prompt)), copies=1, room=1)
        assert batch.lengths.tolist() == [7, 3, 6]
        for step in range(3):
            batch.ensure_room(1)
            positions, mask = batch.step_inputs()
            ids = torch.tensor([[f[step]] for f in following])
            logits = tiny.module(
                input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=batch
            ).logits[:, -1]
            batch.advance()
            for row, (prompt, more) in enumerate(zip(prompts, following, strict=True)):
                full = torch.tensor([prompt + more[: step + 1]])
                expected = tiny.module(input_ids=full).logits[0, -1]
                torch.testing.assert_close(logits[row], expected, rtol=0, atol=1e-5)
        assert batch.capacity >= 10
        batch.keep([2, 0])  # row 1 finished; the others move up, in that order
        assert batch.lengths.tolist() == [9, 10]
        first = batch.prefix(1, 10)[0][0]
        expected_keys = BufferCache(2, capacity=10)
        tiny.module(
            input_ids=torch.tensor([prompts[0] + following[0]]), past_key_values=expected_keys
        )
        torch.testing.assert_close(first, expected_keys.prefix(10)[0][0], rtol=0, atol=1e-5)


def test_batch_buffers_hold_no_nan_beyond_row_lengths() -> None:
    batch = BatchCache(1, heads=2, head_dim=4, dtype=torch.float32)
    batch.add([kv(3)], copies=2, room=2)
    batch.add([kv(1)], copies=1, room=600)
    layer = batch.batch_layers[0]
    assert torch.isfinite(layer.key_buf).all() and torch.isfinite(layer.value_buf).all()
    assert layer.key_buf.shape[:3] == (3, 2, batch.capacity) and batch.capacity >= 601
    torch.testing.assert_close(layer.key_buf[1, :, :3], kv(3)[0][0])


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
    work = BufferCache(2, capacity=8)
    load_prefix(work, match)
    assert work.get_seq_length() == 3
    for layer in work.buffers:
        layer.update(*(t[:, :, :1] + 100 for t in kv(1)))
    for (k, v), (k0, v0) in zip(match.entry.layers, before, strict=True):
        assert torch.equal(k, k0) and torch.equal(v, v0)
    assert work.buffers[0].keys is not None
    assert float(work.buffers[0].keys[0, 0, 3, 0]) == 100.0


def test_only_full_attention_models_use_buffers(tiny: LoadedModel) -> None:
    config = tiny.module.config
    assert supports_buffer_cache(config)
    sliding = type(config).from_dict({**config.to_dict(), "layer_types": ["sliding_attention"] * 2})
    assert not supports_buffer_cache(sliding)


@given(st.lists(st.integers(0, 3), max_size=30), st.lists(st.integers(0, 3), max_size=30))
def test_common_prefix_length_matches_its_definition(a: list[int], b: list[int]) -> None:
    n = common_prefix_length(np.array(a, dtype=np.int64), np.array(b, dtype=np.int64))
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]
