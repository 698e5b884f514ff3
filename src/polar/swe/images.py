"""The container image an instance runs in, named the way SWE-bench's harness names it.

SWE-bench publishes ``swebench/sweb.eval.x86_64.<instance_id>:latest``, lowercased, with each
``__`` written ``_1776_`` (Docker Hub refuses double underscores). Mirrors keep the scheme under
another namespace or registry; SWE-Gym's images, for one, are published as
``xingyaoww/sweb.eval.x86_64.<id>`` with ``__`` written ``_s_``. An instance that names its own
image (SWE-smith's ``image_name``) keeps it.
"""

from __future__ import annotations

DUNDER = "_1776_"


def image_name(
    instance_id: str,
    *,
    namespace: str = "swebench",
    arch: str = "x86_64",
    tag: str = "latest",
    registry: str | None = None,
    dunder: str = DUNDER,
) -> str:
    """``[registry/]namespace/sweb.eval.<arch>.<instance_id>:<tag>`` as SWE-bench spells it."""
    arch = "x86_64" if arch == "amd64" else arch  # SWE-bench tags amd64 images x86_64
    name = f"{namespace}/sweb.eval.{arch}.{instance_id}:{tag}".replace("__", dunder).lower()
    return with_registry(name, registry)


def with_registry(image: str, registry: str | None) -> str:
    """``image`` pulled from ``registry``, unless it already names a registry host."""
    if not registry or _has_registry(image):
        return image
    return f"{registry.rstrip('/')}/{image}"


def _has_registry(image: str) -> bool:
    """Docker's rule: a first path component with a dot or a port, or localhost, is a host."""
    first, slash, _ = image.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost")
