"""Runtimes by name (or ``module:Class``), built from a :class:`RuntimeSpec`."""

from __future__ import annotations

from pathlib import Path

from polar.registry import Registry
from polar.runtimes.apptainer import ApptainerRuntime
from polar.runtimes.base import AsgiApp, Runtime, RuntimeOptions
from polar.runtimes.bubblewrap import BubblewrapRuntime
from polar.runtimes.docker import DockerRuntime
from polar.runtimes.local import LocalRuntime
from polar.schemas.task import RuntimeSpec

RUNTIMES: Registry[Runtime] = Registry("runtime")
RUNTIMES.add("local", LocalRuntime)
RUNTIMES.add("bubblewrap", BubblewrapRuntime)
RUNTIMES.add("docker", DockerRuntime)
RUNTIMES.add("apptainer", ApptainerRuntime)


def runtime_names() -> list[str]:
    """The registered runtime kinds (a ``module:Class`` kind is accepted besides these)."""
    return RUNTIMES.names()


def needs_image(kind: str) -> bool:
    """Whether the ``kind`` runtime runs an image (``spec.image``) rather than the host."""
    return bool(getattr(RUNTIMES.get(kind), "needs_image", False))


def binds_host_paths(kind: str) -> bool:
    """Whether the ``kind`` runtime takes ``options.ro_binds``: host paths bound in read-only,
    how a sandbox on the host's own system sees a harness install (bubblewrap)."""
    options = getattr(RUNTIMES.get(kind), "options_model", RuntimeOptions)
    return "ro_binds" in options.model_fields


def unsandboxed_runtimes() -> frozenset[str]:
    """The registered kinds that run the harness unconfined, as the node's user (``local``)."""
    return frozenset(
        kind for kind in RUNTIMES if not getattr(RUNTIMES.get(kind), "sandboxed", True)
    )


def create_runtime(
    spec: RuntimeSpec, session_dir: Path, gateway_url: str, *, model_api: AsgiApp | None = None
) -> Runtime:
    """An unstarted runtime of ``spec.kind``; a ``module:Class`` kind gets the same arguments.

    ``model_api`` is the session's model-API view: what an isolating runtime serves to its
    sandbox in place of the gateway's whole address.
    """
    return RUNTIMES.create(spec.kind, spec, session_dir, gateway_url, model_api=model_api)
