"""Runtimes by name (or ``module:Class``), built from a :class:`RuntimeSpec`."""

from __future__ import annotations

from pathlib import Path

from polar.registry import Registry
from polar.runtimes.apptainer import ApptainerRuntime
from polar.runtimes.base import Runtime
from polar.runtimes.bubblewrap import BubblewrapRuntime
from polar.runtimes.docker import DockerRuntime
from polar.runtimes.local import LocalRuntime
from polar.schemas.task import RuntimeSpec

RUNTIMES: Registry[Runtime] = Registry("runtime")
RUNTIMES.add("local", LocalRuntime)
RUNTIMES.add("bubblewrap", BubblewrapRuntime)
RUNTIMES.add("docker", DockerRuntime)
RUNTIMES.add("apptainer", ApptainerRuntime)


def create_runtime(spec: RuntimeSpec, session_dir: Path, gateway_url: str) -> Runtime:
    """An unstarted runtime of ``spec.kind``; a ``module:Class`` kind gets the same arguments."""
    return RUNTIMES.create(spec.kind, spec, session_dir, gateway_url)
