"""The training run's allocator settings: one arena, a trim between phases (glibc)."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import pytest

from polar.training import allocator
from polar.training.trainer_config import TrainConfig

libc = allocator._libc()
needs_glibc = pytest.mark.skipif(libc is None, reason="glibc's mallopt/malloc_trim not here")


@needs_glibc
def test_a_trim_returns_pages_freed_below_a_live_block() -> None:
    """Freed blocks under a block still in use stay resident with glibc's defaults (the heap
    cannot shrink past a live block); release_freed gives their pages back."""
    assert libc is not None
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block = 8192  # below any mmap threshold: from the heap
    blocks = [libc.malloc(block) for _ in range(12_000)]  # ~94 MiB
    for b in blocks:
        ctypes.memset(b, 1, block)  # resident
    pin = libc.malloc(block)  # above them: the heap's top stays in use
    for b in blocks:
        libc.free(b)
    try:
        held = allocator.memory_mib()["rss_mib"]
        assert allocator.release_freed()
        after = allocator.memory_mib()["rss_mib"]
    finally:
        libc.free(pin)
    assert held - after > 60, (held, after)


@needs_glibc
def test_arenas_are_capped_and_bad_counts_refused() -> None:
    assert allocator.use_arenas(None)
    with pytest.raises(ValueError, match="arenas must be >= 1"):
        allocator.use_arenas(0)


_PHASE_PROBE = """
import ctypes, json
from polar.training import allocator

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = allocator._libc()
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
mapped = lambda: int(libc.mallinfo2().hblks)
size = 4 << 20
libc.free(libc.malloc(16 << 20))  # glibc's own threshold rises to 16 MiB, as in a long run
base = mapped()
block = libc.malloc(size)
default = mapped() - base
libc.free(block)
libc.malloc_trim(0)  # the heap's top shrinks back: the next block needs new memory
with allocator.training_phase(1 << 20):
    block = libc.malloc(size)
    inside = mapped() - base
    libc.free(block)
block = libc.malloc(size)
print(json.dumps({"default": default, "inside": inside, "after": mapped() - base}))
"""


@needs_glibc
def test_a_training_phase_maps_large_blocks_of_their_own_then_returns_to_the_heap() -> None:
    """Where the heap must grow for a large block, the phase gives it a mapping of its own
    (glibc counts it in ``hblks``; its pages leave with its free) where glibc's raised
    threshold would have grown the heap; after the phase the same block is in the heap again.
    In a fresh interpreter: a long process's heap may hold a free block of that size, which
    glibc reuses whatever the threshold."""
    done = subprocess.run(
        [sys.executable, "-c", _PHASE_PROBE], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"default": 0, "inside": 1, "after": 0}


def test_memory_figures_are_mib_and_the_peak_is_at_least_the_current() -> None:
    figures = allocator.memory_mib()
    assert 10 < figures["rss_mib"] <= figures["peak_rss_mib"] < 1 << 20


def test_the_training_config_defaults_to_one_arena_and_trims() -> None:
    memory = TrainConfig().memory
    assert (memory.arenas, memory.train_mmap_threshold_kib, memory.trim_between_phases) == (
        1,
        1024,
        True,
    )
    with pytest.raises(ValueError, match="arenas"):
        TrainConfig.model_validate({"memory": {"arenas": 0}})
