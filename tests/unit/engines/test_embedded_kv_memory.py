"""How many bytes of keys and values the embedded engine holds for a prompt, at its worst.

Counted, not sampled from the process: at every return of a function of the engine (and of
every C call made from one, such as a ``clone``), the storages of every tensor reachable from
the engine's state and from the engine's frames on the stack are summed, the model's weights
left out. Each storage is counted once, whole (its unused room included), so the figure is
deterministic and is what the allocator holds for keys and values at that moment.

A prompt's keys and values are held once: in its batch row (with its decode room), and besides
that at most in one bounded prefix-cache entry. Before, they were also in a prefill cache of
their own until the row was filled from it, so three copies existed at once.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import pytest
import torch

from polar.engines.embedded.core import EmbeddedEngineCore
from polar.engines.embedded.loader import LoadedModel, load_model
from polar.engines.embedded.sampling import GenerationParams

ENGINE = "polar/engines/embedded/"
ROOM = 8  # max_tokens: a row's decode room (under INITIAL_DECODE_ROOM)


@pytest.fixture(scope="module")
def tiny() -> Iterator[LoadedModel]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model("tiny")
    torch.set_num_threads(threads)


def token_bytes(loaded: LoadedModel) -> int:
    """Keys and values of one position, every layer."""
    config = loaded.module.config
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4


@dataclass
class KVMeter:
    """The largest number of key/value bytes the engine held at once, and the prefix cache's
    share at that moment."""

    core: EmbeddedEngineCore
    weights: set[int] = field(default_factory=set)
    peak: int = 0
    peak_cached: int = 0

    def __post_init__(self) -> None:
        self.weights = {
            t.untyped_storage().data_ptr() for t in self.core.module.state_dict().values()
        }

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event in ("return", "c_return") and ENGINE in frame.f_code.co_filename:
            self.measure(frame)

    def measure(self, frame: FrameType | None) -> None:
        cached = self._storages([self.core.prefix_cache])
        roots: list[Any] = [self.core]
        while frame is not None:
            if ENGINE in frame.f_code.co_filename:
                roots.append(dict(frame.f_locals))
            frame = frame.f_back
        held = self._storages(roots) | cached
        total = sum(held.values())
        if total > self.peak:
            self.peak, self.peak_cached = total, sum(cached.values())

    def _storages(self, roots: list[Any]) -> dict[int, int]:
        found: dict[int, int] = {}
        seen: set[int] = set()
        stack = list(roots)
        while stack:
            obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, torch.Tensor):  # keys and values: [batch, heads, positions, dim]
                storage = obj.untyped_storage()
                floats = obj.dtype.is_floating_point
                if floats and obj.dim() == 4 and storage.data_ptr() not in self.weights:
                    found[storage.data_ptr()] = storage.nbytes()
            elif isinstance(obj, (torch.nn.Module, LoadedModel, threading.Condition, type)):
                continue
            elif isinstance(obj, dict):
                stack.extend(obj.values())
            elif isinstance(obj, (list, tuple, set)) or type(obj).__name__ in ("deque",):
                stack.extend(obj)
            elif hasattr(obj, "__dict__") and not callable(obj):
                stack.extend(vars(obj).values())
        return found


def metered(core: EmbeddedEngineCore, prompts: list[list[int]]) -> KVMeter:
    """Generate ``ROOM`` tokens after each prompt (all queued at once), metering throughout."""
    meter = KVMeter(core)
    threading.setprofile(meter)  # the scheduler thread starts on the first submit
    try:
        jobs = [
            core.prepare_ids(p, GenerationParams(max_tokens=ROOM, seed=i, ignore_eos=True))
            for i, p in enumerate(prompts)
        ]
        with core._cond:
            futures = [core.submit(job) for job in jobs]
        for future in futures:
            future.result(timeout=120)
    finally:
        threading.setprofile(None)
        core.close()
    return meter


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(
        3, 40_000, (length,), generator=torch.Generator().manual_seed(seed)
    ).tolist()


def test_a_prompt_is_held_once_besides_its_prefix_cache_entry(tiny: LoadedModel) -> None:
    length, per_token = 400, token_bytes(tiny)
    meter = metered(EmbeddedEngineCore(tiny, prefill_chunk=64), [prompt(length, 0)])
    row = (length + ROOM) * per_token
    entry = (length + ROOM - 1) * per_token  # the finished generation's entry, the longest
    print(f"one prompt: {meter.peak / (length * per_token):.2f} prompts' K/V at most")
    assert meter.peak_cached <= entry
    assert meter.peak <= row + entry  # before: + a prefill cache, 3.0 prompts


def test_concurrent_prompts_are_each_held_once_without_a_prefix_cache(tiny: LoadedModel) -> None:
    lengths, per_token = [300, 120, 250, 200], token_bytes(tiny)
    core = EmbeddedEngineCore(tiny, prefill_chunk=32, kv_cache_entries=0)
    meter = metered(core, [prompt(n, i) for i, n in enumerate(lengths)])
    batch = len(lengths) * (max(lengths) + ROOM) * per_token  # one rectangular batch
    layers = tiny.module.config.num_hidden_layers
    moving = batch // (2 * layers)  # rows are moved one layer's keys (or values) at a time
    print(f"four prompts: {meter.peak / (sum(lengths) * per_token):.2f} prompts' K/V at most")
    assert meter.peak_cached == 0
    assert meter.peak <= batch + moving  # before: prefill caches beside the batch, regrown


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
