"""The locally built image the live docker tests run, why they cannot run here, and task images
built on it (a repository at ``/testbed``, as SWE-bench's images have)."""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

BUILD_SCRIPT = Path(__file__).with_name("build-docker-image.sh")
# build-docker-image.sh's default; POLAR_TEST_DOCKER_IMAGE names another (tests never pull).
IMAGE = os.environ.get("POLAR_TEST_DOCKER_IMAGE", "polar-test-python:bookworm")


def docker_unready(image: str = IMAGE) -> str | None:
    """Why a live Docker test cannot run here, or None when it can."""
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker CLI unusable: {exc}"
    if info.returncode != 0:
        return "no Docker engine is running (docker info failed)"
    inspect = subprocess.run(["docker", "image", "inspect", image], capture_output=True)
    if inspect.returncode != 0:
        return f"image {image} is not present (tests do not pull; build it: {BUILD_SCRIPT.name})"
    return None


def task_image_unready(image: str = IMAGE) -> str | None:
    """Why a live test of a task image (git and pytest inside) cannot run here, or None."""
    if reason := docker_unready(image):
        return reason
    probe = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, "sh", "-c",
         'command -v git && python3 -c "import pytest"'],
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    if probe.returncode != 0:
        return f"image {image} lacks git or pytest (rebuild it: {BUILD_SCRIPT.name})"
    return None


def build_task_image(image: str, tree: Path, workdir: str = "/testbed", base: str = IMAGE) -> None:
    """Commit the host directory ``tree`` at ``workdir`` onto ``base`` as the local image
    ``image`` (its working directory ``workdir``), replacing any image of that tag; no registry.
    The files belong to root inside, as in SWE-bench's images."""
    container = f"polar-task-image-{secrets.token_hex(4)}"
    subprocess.run(["docker", "create", "--name", container, base], check=True, capture_output=True)
    try:
        subprocess.run(
            ["docker", "cp", f"{tree}/.", f"{container}:{workdir}"], check=True, capture_output=True
        )
        subprocess.run(
            ["docker", "commit", "--change", f"WORKDIR {workdir}", container, image],
            check=True,
            capture_output=True,
        )
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True)
