"""Key/value caches for the embedded engine: a growing buffer per generation, and a prefix cache.

Agent sessions resend their whole, growing conversation every turn. :class:`PrefixCache` keeps
the keys and values of recently computed token sequences (bounded, least recently used first
out) so the next turn only pays for the tokens that are new since the longest cached prefix.

:class:`BufferCache` holds one prompt during prefill. It replaces transformers' ``DynamicLayer``,
which concatenates the whole cache on every step (a copy that grows with the context), with a
preallocated buffer that new positions are written into.

:class:`BatchCache` holds every sequence being decoded, one row each, at its own length. A decode
step then runs all of them through the model at once: on CPU a decode step is bound by reading
the weights, so a batch of rows costs little more than one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer

# Buffers grow by at least this many positions, so decode does not reallocate every step.
MIN_GROWTH = 256


class BufferLayer(DynamicLayer):
    """One attention layer's keys and values in a preallocated, growing buffer."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = max(1, capacity)
        self.length = 0
        self._key_buf = torch.empty(0)
        self._value_buf = torch.empty(0)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        batch, heads, _, head_dim = key_states.shape
        self._key_buf = key_states.new_empty((batch, heads, self.capacity, head_dim))
        self._value_buf = value_states.new_empty(
            (batch, heads, self.capacity, value_states.shape[-1])
        )
        self._expose()
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        if self.length + new > self.capacity:
            self._grow(self.length + new)
        end = self.length + new
        self._key_buf[:, :, self.length : end] = key_states
        self._value_buf[:, :, self.length : end] = value_states
        self.length = end
        return self._expose()

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` positions (transformers' negative convention)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of positions to remove")
        self.length = max(0, self.length + tokens_to_remove)
        if self.is_initialized:
            self._expose()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if not self.is_initialized:
            return
        self._key_buf = self._key_buf.repeat_interleave(repeats, dim=0)
        self._value_buf = self._value_buf.repeat_interleave(repeats, dim=0)
        self._expose()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if not self.is_initialized:
            return
        self._key_buf = self._key_buf[indices]
        self._value_buf = self._value_buf[indices]
        self._expose()

    def load(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Start from a copy of ``keys``/``values`` (a cached prefix), leaving room to grow."""
        self.capacity = max(self.capacity, keys.shape[-2])
        self.lazy_initialization(keys, values)
        self.length = keys.shape[-2]
        self._key_buf[:, :, : self.length] = keys
        self._value_buf[:, :, : self.length] = values
        self._expose()

    def prefix(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``length`` positions (a view, batch row 0)."""
        return self._key_buf[:1, :, :length], self._value_buf[:1, :, :length]

    def _grow(self, needed: int) -> None:
        capacity = max(needed, self.capacity + max(MIN_GROWTH, self.capacity // 2))
        for name in ("_key_buf", "_value_buf"):
            old = getattr(self, name)
            grown = old.new_empty((*old.shape[:2], capacity, old.shape[-1]))
            grown[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, grown)
        self.capacity = capacity

    def _expose(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys = self.keys = self._key_buf[:, :, : self.length]
        values = self.values = self._value_buf[:, :, : self.length]
        return keys, values


class BufferCache(Cache):
    """A transformers cache made of :class:`BufferLayer` s, sized for ``capacity`` positions."""

    def __init__(self, num_layers: int, capacity: int) -> None:
        self.buffers = [BufferLayer(capacity) for _ in range(num_layers)]
        super().__init__(layers=list(self.buffers))

    def prefix(self, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's first ``length`` positions (views)."""
        return [layer.prefix(length) for layer in self.buffers]


class BatchLayer(DynamicLayer):
    """One layer's keys and values for all rows of a :class:`BatchCache`.

    Buffers are zero-initialised: attention reads every row up to the longest one, and masked
    positions must hold finite numbers (a NaN there would survive a zero attention weight).
    """

    def __init__(self, owner: BatchCache) -> None:
        super().__init__()
        self.owner = owner
        self.key_buf = torch.zeros((0, owner.heads, 0, owner.head_dim), dtype=owner.dtype)
        self.value_buf = torch.zeros_like(self.key_buf)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.arange(key_states.shape[0])
        positions = self.owner.lengths
        self.key_buf[rows, :, positions] = key_states[:, :, 0]
        self.value_buf[rows, :, positions] = value_states[:, :, 0]
        end = self.owner.span()
        self.keys, self.values = (
            self.key_buf[: len(rows), :, :end],
            self.value_buf[: len(rows), :, :end],
        )
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.owner.span() - 1


class BatchCache(Cache):
    """Sequences of different lengths decoded together, one row each.

    Row ``i`` holds ``lengths[i]`` positions; a decode step writes each row's new token at its
    own length. :meth:`step_inputs` gives the per-row positions and the attention mask that
    keep rows from seeing each other's padding. Rows join after their prefill (:meth:`add`) and
    leave when done (:meth:`keep`); both copy keys and values, which happens once per request.
    """

    def __init__(self, num_layers: int, heads: int, head_dim: int, dtype: torch.dtype) -> None:
        self.heads, self.head_dim, self.dtype = heads, head_dim, dtype
        self.batch_layers = [BatchLayer(self) for _ in range(num_layers)]
        self.lengths = torch.zeros(0, dtype=torch.long)
        self.capacity = 0
        super().__init__(layers=list(self.batch_layers))

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def span(self) -> int:
        """Positions a step attends over: the longest row, plus the token being written."""
        return int(self.lengths.max()) + 1 if self.rows else 0

    def add(self, prefix: list[tuple[torch.Tensor, torch.Tensor]], copies: int, room: int) -> int:
        """Append ``copies`` rows starting from ``prefix`` (one layer's keys/values each, batch
        1); keep ``room`` free positions after it. Returns the first new row's index."""
        length = prefix[0][0].shape[-2]
        first = self.rows
        self._reserve(first + copies, length + room)
        for layer, (keys, values) in zip(self.batch_layers, prefix, strict=True):
            layer.key_buf[first : first + copies, :, :length] = keys
            layer.value_buf[first : first + copies, :, :length] = values
        self.lengths = torch.cat([self.lengths, torch.full((copies,), length, dtype=torch.long)])
        return first

    def keep(self, rows: list[int]) -> None:
        """Drop every row not in ``rows``; the kept rows move to the front, in that order.

        Capacity shrinks back to what the kept rows need, so one long request does not leave
        every later batch with its footprint.
        """
        index = torch.tensor(rows, dtype=torch.long)
        self.lengths = self.lengths[index]
        capacity = min(self.capacity, int(self.lengths.max()) + MIN_GROWTH) if rows else 0
        for layer in self.batch_layers:
            layer.key_buf = layer.key_buf[:, :, :capacity].index_select(0, index)
            layer.value_buf = layer.value_buf[:, :, :capacity].index_select(0, index)
        self.capacity = capacity

    def ensure_room(self, extra: int) -> None:
        """Make sure every row can grow by ``extra`` positions."""
        if self.rows:
            self._reserve(self.rows, int(self.lengths.max()) + extra)

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Position ids ``[rows, 1]`` and a boolean attention mask ``[rows, 1, 1, span]``."""
        span = torch.arange(self.span())
        mask = span[None, :] <= self.lengths[:, None]
        return self.lengths[:, None].clone(), mask[:, None, None, :]

    def advance(self) -> None:
        self.lengths = self.lengths + 1

    def prefix(self, row: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row ``row``'s first ``length`` positions in every layer (views)."""
        return [
            (layer.key_buf[row : row + 1, :, :length], layer.value_buf[row : row + 1, :, :length])
            for layer in self.batch_layers
        ]

    def _reserve(self, rows: int, positions: int) -> None:
        allocated = self.batch_layers[0].key_buf.shape[0]
        if rows <= allocated and positions <= self.capacity:
            return
        capacity = self.capacity
        if positions > capacity:
            capacity = max(positions, capacity + max(MIN_GROWTH, capacity // 2))
        rows = max(rows, allocated)
        for layer in self.batch_layers:
            for name in ("key_buf", "value_buf"):
                old = getattr(layer, name)
                grown = torch.zeros((rows, self.heads, capacity, self.head_dim), dtype=self.dtype)
                if allocated:
                    grown[:allocated, :, : self.capacity] = old
                setattr(layer, name, grown)
        self.capacity = capacity


def supports_buffer_cache(config: Any) -> bool:
    """Only plain full-attention decoders can use these caches (and so batching and reuse)."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = getattr(text_config, "layer_types", None)
    if layer_types is not None:
        return all(kind == "full_attention" for kind in layer_types)
    return getattr(text_config, "sliding_window", None) is None


@dataclass
class PrefixEntry:
    """Keys and values of ``tokens`` computed under ``policy_version``."""

    tokens: np.ndarray
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    policy_version: int
    nbytes: int


@dataclass
class PrefixMatch:
    entry: PrefixEntry
    length: int


class PrefixCache:
    """Bounded LRU of computed token prefixes, looked up by longest common prefix.

    ``max_entries`` and ``max_bytes`` both bound it; 0 entries disables it. An entry made
    redundant by a longer one that extends it (the previous turn of the same session) is
    dropped on insert, so one session costs one entry.
    """

    def __init__(self, max_entries: int = 32, max_bytes: int = 2 << 30) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()
        self._next_key = 0
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def lookup(self, tokens: Sequence[int], policy_version: int, limit: int) -> PrefixMatch | None:
        """The entry sharing the longest prefix with ``tokens`` (at most ``limit`` positions),
        counted as a hit or a miss and marked as recently used."""
        if self.max_entries <= 0 or limit <= 0:
            return None
        with self._lock:
            best = self._longest(tokens, policy_version, limit)
            if best is None:
                self.misses += 1
                return None
            length, key = best
            self._entries.move_to_end(key)
            self.hits += 1
            self.reused_tokens += length
            return PrefixMatch(self._entries[key], length)

    def match_length(self, tokens: Sequence[int], policy_version: int, limit: int) -> int:
        """How many leading positions of ``tokens`` a :meth:`lookup` would reuse now, without
        counting or touching anything (the scheduler asks this to plan)."""
        if self.max_entries <= 0 or limit <= 0:
            return 0
        with self._lock:
            best = self._longest(tokens, policy_version, limit)
        return 0 if best is None else best[0]

    def _longest(
        self, tokens: Sequence[int], policy_version: int, limit: int
    ) -> tuple[int, int] | None:
        query = np.asarray(tokens, dtype=np.int64)
        best: tuple[int, int] | None = None
        for key, entry in self._entries.items():
            if entry.policy_version != policy_version:
                continue
            length = min(common_prefix_length(query, entry.tokens), limit)
            if length > 0 and (best is None or length > best[0]):
                best = (length, key)
        return best

    def store(
        self,
        tokens: Sequence[int],
        prefix: list[tuple[torch.Tensor, torch.Tensor]],
        policy_version: int,
    ) -> None:
        """Remember a copy of ``prefix`` (each layer's keys/values) as computed for ``tokens``."""
        if self.max_entries <= 0 or not tokens:
            return
        views = [(k[:, :, : len(tokens)], v[:, :, : len(tokens)]) for k, v in prefix]
        nbytes = sum(k.nbytes + v.nbytes for k, v in views)
        if nbytes > self.max_bytes:
            return
        layers = [(k.clone(), v.clone()) for k, v in views]
        entry = PrefixEntry(np.asarray(tokens, dtype=np.int64), layers, policy_version, nbytes)
        with self._lock:
            for key in [k for k, e in self._entries.items() if _extends(entry, e)]:
                self._drop(key)
            self._entries[self._next_key] = entry
            self._next_key += 1
            self._bytes += nbytes
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def _drop(self, key: int) -> None:
        self._bytes -= self._entries.pop(key).nbytes


def load_prefix(cache: BufferCache, match: PrefixMatch) -> None:
    """Fill an empty buffer cache with the first ``match.length`` positions of ``match.entry``."""
    copy_prefix(cache, match.entry.layers, match.length)


def copy_prefix(
    cache: BufferCache, layers: list[tuple[torch.Tensor, torch.Tensor]], length: int
) -> None:
    """Fill an empty buffer cache with a copy of the first ``length`` positions of ``layers``
    (each layer's keys and values, batch 1): a cached entry, or another prompt's prefill."""
    for layer, (keys, values) in zip(cache.buffers, layers, strict=True):
        layer.load(keys[:, :, :length], values[:, :, :length])


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def _extends(new: PrefixEntry, old: PrefixEntry) -> bool:
    return (
        old.policy_version == new.policy_version
        and len(old.tokens) <= len(new.tokens)
        and common_prefix_length(old.tokens, new.tokens) == len(old.tokens)
    )
