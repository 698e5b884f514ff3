"""glibc's allocator settings for a training run, which holds several phases in one process.

A run samples (the engine's thread), fine-tunes and updates (the trainer's thread) and
evaluates, one after another. With glibc's defaults each thread allocates from an arena of its
own and keeps what it freed for itself, and the size above which a block gets its own mapping
(returned to the system at free) rises to 32 MiB after the first large free: so a phase's
freed tensors stay in its thread's heap, another thread's phase cannot reuse them, and the
run's peak is close to the sum of its phases instead of the largest one. One arena lets every
phase reuse the same free blocks, a trim after each phase returns the free pages, and while
the model trains large blocks get mappings of their own (:func:`training_phase`).

Elsewhere than glibc (musl, macOS) these are no-ops that say so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("polar.training")

# mallopt parameters, from glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
SERVING_MMAP_THRESHOLD = 32 << 20
"""Outside training phases: the most glibc's own dynamic threshold rises to (64-bit)."""


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: raises AttributeError elsewhere
        libc.mallopt  # noqa: B018
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def use_arenas(arenas: int | None) -> bool:
    """Cap the number of malloc arenas (None: glibc's default, 8 per core); False where this is
    not glibc. Threads started before this call keep the arena they have."""
    if arenas is not None and arenas < 1:
        raise ValueError(f"arenas must be >= 1, not {arenas}")
    libc = _libc()
    if libc is None:
        log.info("not glibc: the malloc arena count is left as it is")
        return False
    if arenas is not None and not libc.mallopt(_M_ARENA_MAX, int(arenas)):
        raise OSError(f"mallopt(M_ARENA_MAX, {arenas}) failed")
    return True


@contextmanager
def training_phase(mmap_threshold: int | None) -> Iterator[None]:
    """While the model trains, blocks of ``mmap_threshold`` bytes and up get a mapping of their
    own, returned to the system when freed, instead of fragmenting the heap; after it, the
    serving threshold (the phase's end trims, :func:`release_freed`, if the run asks). Not
    while serving: the engine grows its key-value caches by a new block per token, and a
    mapping each time would slow decoding. None: no change."""
    libc = _libc()
    if mmap_threshold is None or libc is None:
        yield
        return
    if mmap_threshold < 0 or not libc.mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold)):
        raise ValueError(f"mallopt(M_MMAP_THRESHOLD, {mmap_threshold}) refused")
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_THRESHOLD, SERVING_MMAP_THRESHOLD)


def release_freed() -> bool:
    """Return every arena's free pages to the system (``malloc_trim(0)``); True if any were."""
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0))


def memory_mib() -> dict[str, int]:
    """This process's resident memory now and its peak so far, in MiB (Linux; empty elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return {}
    import resource

    page = resource.getpagesize()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"rss_mib": resident_pages * page >> 20, "peak_rss_mib": peak_kib >> 10}
