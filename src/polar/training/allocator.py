"""glibc's allocator settings for a training run, which holds several phases in one process.

A run samples (the engine's thread), fine-tunes and updates (the trainer's thread) and
evaluates, one after another. With glibc's defaults each thread allocates from an arena of its
own and keeps what it freed for itself, and the size above which a block gets its own mapping
(returned to the system at free) rises to 32 MiB after the first large free: so a phase's
freed tensors stay in its thread's heap, another thread's phase cannot reuse them, and the
run's peak is close to the sum of its phases instead of the largest one. One arena lets every
phase reuse the same free blocks, and a trim after each phase returns the free pages.

Elsewhere than glibc (musl, macOS) these are no-ops that say so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from dataclasses import dataclass

log = logging.getLogger("polar.training")

# mallopt parameters, from glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


@dataclass(frozen=True)
class AllocatorSettings:
    """What :func:`configure` applied; ``glibc`` False means nothing was."""

    glibc: bool
    arenas: int | None
    mmap_threshold: int | None


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


def configure(arenas: int | None, mmap_threshold: int | None) -> AllocatorSettings:
    """Cap the number of malloc arenas and fix the mmap threshold (bytes); None leaves
    glibc's default. Threads started before this call keep the arena they have."""
    if (arenas is not None and arenas < 1) or (mmap_threshold or 0) < 0:
        raise ValueError(f"arenas must be >= 1 and mmap_threshold >= 0: {arenas}, {mmap_threshold}")
    libc = _libc()
    if libc is None:
        log.info("not glibc: allocator settings left as they are")
        return AllocatorSettings(False, None, None)
    if arenas is not None and not libc.mallopt(_M_ARENA_MAX, int(arenas)):
        raise OSError(f"mallopt(M_ARENA_MAX, {arenas}) failed")
    if mmap_threshold is not None and not libc.mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold)):
        raise OSError(f"mallopt(M_MMAP_THRESHOLD, {mmap_threshold}) failed")
    return AllocatorSettings(True, arenas, mmap_threshold)


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
