"""The locally built image the live docker tests run, and why they cannot run here."""

from __future__ import annotations

import os
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
