"""Key/value caches for the embedded engine: one batch of rows, and a prefix cache.

Agent sessions resend their whole, growing conversation every turn. :class:`PrefixCache` keeps
the keys and values of recently computed token sequences (bounded, least recently used first
out) so the next turn only pays for the tokens that are new since the longest cached prefix.

:class:`BatchCache` holds every sequence the engine is working on, one row each, at its own
length: a prompt is prefilled straight into its row (:meth:`BatchCache.row_cache`), and its row
then joins the rows being decoded without being copied again, so a prompt's keys and values are
held once (besides, at most, its bounded prefix-cache entry). A decode step runs every decoding
row through the model at once: on CPU a decode step is bound by reading the weights, so a batch
of rows costs little more than one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import inspect
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer

# Decode rows grow by at least this many positions, so decode does not reallocate every step.
MIN_GROWTH = 256

KVLayers = list[tuple[torch.Tensor, torch.Tensor]]


def cache_keyword(module: Any) -> str:
    """The name ``module``'s forward takes its key/value cache under: ``cache`` from
    transformers 5 on (where the old name is a FutureWarning, which the quickstart printed
    among its progress lines), ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: raises AttributeError elsewhere
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def return_freed() -> None:
    """Give the pages of freed blocks back to the system now (glibc's ``malloc_trim``; nothing
    elsewhere).

    The batch's buffers are replaced by larger or smaller ones as rows come and go, and a freed
    block cannot hold a larger one: without this the holes stay resident, and the peak nears the
    sum of every batch the engine had (8 Codex-sized prompts at once: 1,677 MiB above the loaded
    model instead of 876 MiB, which is what the keys and values take)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class BatchLayer(DynamicLayer):
    """One layer's keys and values for all rows of a :class:`BatchCache`; as a cache layer, the
    decode step's view of the decoding rows.

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
        count = key_states.shape[0]
        rows = torch.arange(count)
        positions = self.owner.lengths[:count]
        self.key_buf[rows, :, positions] = key_states[:, :, 0]
        self.value_buf[rows, :, positions] = value_states[:, :, 0]
        end = self.owner.span()
        self.keys, self.values = self.key_buf[:count, :, :end], self.value_buf[:count, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.owner.span() - 1

    def forget_views(self) -> None:
        """Drop the views of the last step, so that replaced buffers are freed at once."""
        self.keys = self.values = None


class RowLayer(DynamicLayer):
    """One layer of one batch row as a prompt's prefill sees it: a batch-1 cache whose new
    positions are written into the row, after the ``start`` it already holds."""

    def __init__(self, layer: BatchLayer, row: int, start: int) -> None:
        super().__init__()
        self.layer, self.rows, self.length = layer, slice(row, row + 1), start
        self.dtype, self.device = layer.key_buf.dtype, layer.key_buf.device
        self.is_initialized = True
        self._expose()

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate: the row was reserved in the batch."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + key_states.shape[-2]
        self.layer.key_buf[self.rows, :, self.length : end] = key_states
        self.layer.value_buf[self.rows, :, self.length : end] = value_states
        self.length = end
        return self._expose()

    def get_seq_length(self) -> int:
        return self.length

    def _expose(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = self.layer.key_buf[self.rows, :, : self.length]
        self.values = self.layer.value_buf[self.rows, :, : self.length]
        return self.keys, self.values


class RowCache(Cache):
    """A transformers cache over one row of a :class:`BatchCache`, for one prefill forward."""

    def __init__(self, batch: BatchCache, row: int) -> None:
        start = int(batch.lengths[row])
        super().__init__(layers=[RowLayer(layer, row, start) for layer in batch.batch_layers])


class BatchCache(Cache):
    """Every sequence being read or decoded, one row each, at its own length.

    Rows ``[0, decoding)`` are being decoded: a decode step writes each one's new token at its
    own length, and :meth:`step_inputs` gives the per-row positions and the attention mask that
    keep rows from seeing each other's padding. The rows after them hold prompts still being
    read: :meth:`reserve` adds them (room for the whole prompt and its first decode positions),
    :meth:`row_cache` prefills into one, and :meth:`arrange` moves rows into the decoding ones
    or drops finished ones. Rows are moved, never held twice: buffers are replaced one layer
    at a time, and the freed ones returned to the system (:func:`return_freed`), so the most
    held at once is the batch and one layer's new buffer.
    """

    def __init__(self, num_layers: int, heads: int, head_dim: int, dtype: torch.dtype) -> None:
        self.heads, self.head_dim, self.dtype = heads, head_dim, dtype
        self.batch_layers = [BatchLayer(self) for _ in range(num_layers)]
        self.lengths = torch.zeros(0, dtype=torch.long)
        self.needs: list[int] = []  # the positions each row was reserved for
        self.decoding = 0
        self.capacity = 0
        super().__init__(layers=list(self.batch_layers))

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def span(self) -> int:
        """Positions a decode step attends over: the longest decoding row, plus the new token."""
        return int(self.lengths[: self.decoding].max()) + 1 if self.decoding else 0

    def reserve(self, copies: int, positions: int) -> int:
        """Append ``copies`` empty rows with room for ``positions`` each (zeros); returns the
        first new row's index. The capacity grows to exactly what they need."""
        first = self.rows
        self._grow(first + copies, max(self.capacity, positions))
        self.lengths = torch.cat([self.lengths, torch.zeros(copies, dtype=torch.long)])
        self.needs += [positions] * copies
        return first

    def row_cache(self, row: int) -> RowCache:
        """A cache that prefills ``row`` from its current length on (then :meth:`extend` it)."""
        return RowCache(self, row)

    def extend(self, row: int, count: int) -> None:
        """Count ``count`` more positions, just written by a prefill, in ``row``."""
        self.lengths[row] += count

    def load(self, row: int, layers: KVLayers, length: int) -> None:
        """Start ``row`` from a copy of the first ``length`` positions of ``layers`` (each
        layer's keys/values, batch 1: a prefix-cache entry, or another row)."""
        for layer, (keys, values) in zip(self.batch_layers, layers, strict=True):
            layer.key_buf[row : row + 1, :, :length] = keys[:, :, :length]
            layer.value_buf[row : row + 1, :, :length] = values[:, :, :length]
        self.lengths[row] = length

    def fan_out(self, row: int, copies: int) -> None:
        """Copy ``row`` into the ``copies - 1`` rows after it (a request's other choices)."""
        length = int(self.lengths[row])
        for other in range(row + 1, row + copies):
            self.load(other, self.prefix(row, length), length)

    def arrange(self, rows: list[int], decoding: int) -> None:
        """Keep exactly ``rows``, in this order; the first ``decoding`` of them are decoded.

        When rows are dropped, capacity shrinks back to what the kept rows need, so one long
        request does not leave every later batch with its footprint.
        """
        if rows == list(range(self.rows)):
            self.decoding = decoding
            return
        index = torch.tensor(rows, dtype=torch.long)
        self.lengths = self.lengths[index]
        self.needs = [self.needs[row] for row in rows]
        self.decoding = decoding
        capacity = 0
        if rows:
            capacity = max(int(self.lengths.max()) + MIN_GROWTH, *self.needs[decoding:], 0)
        capacity = min(self.capacity, capacity)
        for layer in self.batch_layers:
            layer.forget_views()
            layer.key_buf = layer.key_buf[:, :, :capacity].index_select(0, index)
            layer.value_buf = layer.value_buf[:, :, :capacity].index_select(0, index)
            return_freed()
        self.capacity = capacity

    def ensure_room(self, extra: int) -> None:
        """Make sure every decoding row can grow by ``extra`` positions."""
        if not self.decoding:
            return
        positions = int(self.lengths[: self.decoding].max()) + extra
        if positions > self.capacity:
            self._grow(
                self.rows, max(positions, self.capacity + max(MIN_GROWTH, self.capacity // 2))
            )

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Position ids ``[decoding, 1]`` and a boolean attention mask ``[decoding, 1, 1, span]``."""
        lengths = self.lengths[: self.decoding]
        mask = torch.arange(self.span())[None, :] <= lengths[:, None]
        return lengths[:, None].clone(), mask[:, None, None, :]

    def advance(self) -> None:
        """Count the position every decoding row was just given."""
        self.lengths[: self.decoding] += 1

    def prefix(self, row: int, length: int) -> KVLayers:
        """Row ``row``'s first ``length`` positions in every layer (views)."""
        return [
            (layer.key_buf[row : row + 1, :, :length], layer.value_buf[row : row + 1, :, :length])
            for layer in self.batch_layers
        ]

    def _grow(self, rows: int, capacity: int) -> None:
        """Reallocate to ``rows`` x ``capacity`` (neither smaller than now), one layer at a time."""
        allocated = self.batch_layers[0].key_buf.shape[0]
        if rows == allocated and capacity == self.capacity:
            return
        for layer in self.batch_layers:
            layer.forget_views()
            for name in ("key_buf", "value_buf"):
                old = getattr(layer, name)
                grown = torch.zeros((rows, self.heads, capacity, self.head_dim), dtype=self.dtype)
                grown[:allocated, :, : self.capacity] = old
                setattr(layer, name, grown)
                del old  # freed before the next buffer is allocated
            return_freed()
        self.capacity = capacity


def supports_batch_cache(config: Any) -> bool:
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
    layers: KVLayers
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

    def store(self, tokens: Sequence[int], prefix: KVLayers, policy_version: int) -> None:
        """Remember a copy of ``prefix`` (each layer's keys/values) as computed for ``tokens``.

        The entries it replaces (those it extends) and those it evicts are dropped before the
        copy is made, so the cache never holds more than ``max_bytes``, nor a prompt twice.
        """
        if self.max_entries <= 0 or not tokens:
            return
        views = [(k[:, :, : len(tokens)], v[:, :, : len(tokens)]) for k, v in prefix]
        nbytes = sum(k.nbytes + v.nbytes for k, v in views)
        if nbytes > self.max_bytes:
            return
        entry = PrefixEntry(np.asarray(tokens, dtype=np.int64), [], policy_version, nbytes)
        with self._lock:
            for key in [k for k, e in self._entries.items() if _extends(entry, e)]:
                self._drop(key)
            while self._entries and (
                len(self._entries) >= self.max_entries or self._bytes + nbytes > self.max_bytes
            ):
                self._drop(next(iter(self._entries)))
            entry.layers = [(k.clone(), v.clone()) for k, v in views]
            self._entries[self._next_key] = entry
            self._next_key += 1
            self._bytes += nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def _drop(self, key: int) -> None:
        self._bytes -= self._entries.pop(key).nbytes


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
