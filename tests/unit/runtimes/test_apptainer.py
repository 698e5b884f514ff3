"""Apptainer: the exact command lines, and a live run when apptainer and an image exist."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from polar.errors import ConfigError, RuntimeStartError
from polar.runtimes.apptainer import ENV_PREFIX, ApptainerRuntime
from polar.runtimes.gateway_relay import FORWARDER_SOURCE
from polar.schemas.task import ImageSource, RuntimeSpec


def make(tmp_path: Path, **spec: object) -> ApptainerRuntime:
    spec.setdefault("image", "/images/py.sif")
    return ApptainerRuntime(
        RuntimeSpec(kind="apptainer", **spec), tmp_path / "sess", "http://127.0.0.1:8000/gw"
    )


def test_exec_command_line_with_gateway_network_and_limits(tmp_path: Path):
    rt = make(tmp_path, cpus=1, memory_mb=512, options={"exec_args": ["--nv"]})
    assert rt.exec_argv(["pytest", "-q"], "/workspace/t") == [
        "apptainer", "exec", "--containall", "--writable-tmpfs", "--pwd", "/workspace/t",
        "--home", f"{rt.home_path}:/home/polar",
        "--bind", f"{rt.workspace_path}:/workspace",
        "--net", "--network", "none",
        "--bind", f"{FORWARDER_SOURCE}:/.polar/forwarder.py:ro",
        "--bind", f"{rt.run_path}:/.polar/run",
        "--cpus", "1", "--memory", "512M",
        "--nv", "/images/py.sif",
        "python3", "-I", "-S", "/.polar/forwarder.py", "--tcp", "127.0.0.1:18080",
        "--unix", "/.polar/run/gateway.sock", "--", "pytest", "-q",
    ]  # fmt: skip
    assert rt.gateway_url_inside == "http://127.0.0.1:18080/gw"
    assert rt.capabilities.network_isolation and not rt.capabilities.persistent_processes


def test_host_network_runs_the_command_directly(tmp_path: Path):
    rt = make(tmp_path, network="host", image="docker://python:3.12-slim")
    argv = rt.exec_argv(["true"], "/workspace")
    assert "--net" not in argv and argv[-2:] == ["docker://python:3.12-slim", "true"]
    assert rt.gateway_url_inside == "http://127.0.0.1:8000/gw"


def test_env_travels_as_apptainerenv_except_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(ENV_PREFIX + "STALE", "from-the-host")
    rt = make(tmp_path)
    launch = rt._launch(["env"], {"TOKEN": "s3cret", "HOME": "/home/polar"}, "/workspace", "e1")
    assert launch.env[ENV_PREFIX + "TOKEN"] == "s3cret"
    assert ENV_PREFIX + "HOME" not in launch.env and ENV_PREFIX + "STALE" not in launch.env
    assert "s3cret" not in " ".join(launch.argv)


def test_an_image_is_required(tmp_path: Path):
    with pytest.raises(ConfigError, match="image"):
        ApptainerRuntime(RuntimeSpec(kind="apptainer"), tmp_path, "http://127.0.0.1:1")


def test_an_image_source_is_copied_by_the_images_cp(tmp_path: Path):
    rt = make(tmp_path, workdir="/testbed", options={"exec_args": ["--nv"]})
    assert rt.seed_argv("/testbed") == [
        "apptainer", "exec", "--containall",
        "--bind", f"{rt.workspace_path}:/.polar/seed", "--nv",
        "/images/py.sif", "cp", "-a", "/testbed/.", "/.polar/seed",
    ]  # fmt: skip


async def test_a_failed_image_copy_fails_start(tmp_path: Path):
    fake = tmp_path / "apptainer"
    fake.write_text("#!/bin/sh\necho \"cp: cannot stat '/nowhere/.'\" >&2\nexit 1\n")
    fake.chmod(0o755)
    source = ImageSource(kind="image", path="/nowhere")
    rt = make(tmp_path, source=source, options={"apptainer": str(fake)})
    with pytest.raises(RuntimeStartError, match="copying /nowhere out of the image") as caught:
        await rt.start()
    assert "cannot stat" in caught.value.stderr_tail


async def test_missing_cli_fails_start_clearly(tmp_path: Path):
    rt = make(tmp_path, options={"apptainer": "/nonexistent/apptainer"})
    with pytest.raises(RuntimeStartError, match="needs the '/nonexistent/apptainer' CLI"):
        await rt.start()


def _apptainer_ready(image: str | None) -> str | None:
    if shutil.which("apptainer") is None:
        return "apptainer is not installed"
    if subprocess.run(["apptainer", "--version"], capture_output=True).returncode != 0:
        return "apptainer --version failed"
    if not image:
        return "set POLAR_TEST_APPTAINER_IMAGE to a local .sif with python3 (tests do not pull)"
    return None


@pytest.mark.slow
async def test_live_apptainer(tmp_path: Path, gateway_url: str):
    image = os.environ.get("POLAR_TEST_APPTAINER_IMAGE")
    if reason := _apptainer_ready(image):
        pytest.skip(reason)
    rt = ApptainerRuntime(RuntimeSpec(kind="apptainer", image=image), tmp_path / "s", gateway_url)
    await rt.start()
    try:
        fetch = f"import urllib.request as u; print(u.urlopen('{rt.gateway_url_inside}/x').read().decode())"
        assert (await rt.exec(["python3", "-c", fetch])).stdout.strip() == "gateway /gw/x"
        assert (await rt.exec("echo ok > f; cat f")).stdout.strip() == "ok"
        assert (rt.workspace_path / "f").exists()
    finally:
        await rt.stop()
