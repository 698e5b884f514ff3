"""Rootless resource limits: CPU pinning with ``taskset`` and an address-space rlimit.

Without a delegated cgroup (the usual case for an unprivileged user, and on these machines),
the limits a process can set on its own children are affinity and rlimits:

- ``cpus``: rounded up to whole cores and pinned with ``taskset``. Sessions spread over the
  available cores by a hash of their directory, so parallel sessions do not pile onto core 0.
  This caps parallelism, not a time quota (that needs cgroups: use docker or apptainer).
- ``memory_mb``: ``prlimit --as``, the virtual address space. It stops runaway allocation, but
  programs that reserve large virtual ranges up front (the JVM, some allocators) can fail to
  start under a tight cap. Node 20 starts fine under 1 GiB.
"""

from __future__ import annotations

import math
import os
import zlib

from polar.schemas.task import RuntimeSpec


def pinned_cores(cpus: float, available: list[int], key: str) -> list[int]:
    """``ceil(cpus)`` of ``available`` cores, a contiguous run starting at a spot chosen by key."""
    count = min(max(1, math.ceil(cpus)), len(available))
    start = zlib.crc32(key.encode()) % len(available)
    return sorted(available[(start + i) % len(available)] for i in range(count))


def limit_prefix(spec: RuntimeSpec, key: str, available: list[int] | None = None) -> list[str]:
    """The argv prefix that applies ``spec.cpus`` and ``spec.memory_mb`` to a command."""
    argv: list[str] = []
    if spec.cpus is not None:
        cores = pinned_cores(spec.cpus, available or sorted(os.sched_getaffinity(0)), key)
        argv += ["taskset", "-c", ",".join(str(core) for core in cores)]
    if spec.memory_mb is not None:
        argv += ["prlimit", f"--as={spec.memory_mb * 1024 * 1024}", "--"]
    return argv


def limit_tools(spec: RuntimeSpec) -> list[str]:
    """The host programs :func:`limit_prefix` needs for ``spec``."""
    return [
        tool
        for tool, wanted in (("taskset", spec.cpus is not None), ("prlimit", spec.memory_mb))
        if wanted
    ]
