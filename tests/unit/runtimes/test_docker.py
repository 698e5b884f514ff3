"""Docker: the exact command lines, the exec flow through a stand-in CLI, and a live run when
a Docker engine and a local image are available."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from images.local_image import IMAGE, docker_unready
from polar.errors import ConfigError, RuntimeStartError
from polar.runtimes.docker import EXEC_ID_VAR, DockerRuntime
from polar.runtimes.gateway_relay import FORWARDER_SOURCE
from polar.schemas.task import ImageSource, RuntimeSpec

# Plays the docker CLI on the host: logs each argv, runs exec'd commands locally with only the
# variables named by -e (as docker does), answers run/create/rm, and copies `cp CONTAINER:PATH`
# out of FAKE_DOCKER_IMAGE_ROOT (the image a test plays).
FAKE_DOCKER = """#!{python}
import json, os, shutil, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[0] == "run":
    if os.environ.get("FAKE_DOCKER_FAIL"):
        sys.exit("docker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock.")
    print("0123456789ab")
elif args[0] == "exec":
    rest, env = args[1:], {{"PATH": os.environ["PATH"]}}
    while rest[0].startswith("-"):
        flag = rest.pop(0)
        if flag in ("-w", "-e"):
            value = rest.pop(0)
            if flag == "-e":
                env[value] = os.environ[value]
    sys.exit(subprocess.call(rest[1:], env=env))
elif args[0] == "cp" and ":" in args[1]:  # out of a container: from FAKE_DOCKER_IMAGE_ROOT
    source = os.environ.get("FAKE_DOCKER_IMAGE_ROOT", "/nonexistent") + args[1].split(":", 1)[1]
    if not os.path.isdir(source):
        sys.exit("Error: Could not find the file in container")
    shutil.copytree(source, args[2], symlinks=True, dirs_exist_ok=True)
"""


def make(tmp_path: Path, **spec: object) -> DockerRuntime:
    spec.setdefault("image", "python:3.12-slim")
    return DockerRuntime(
        RuntimeSpec(kind="docker", **spec), tmp_path / "sess", "http://127.0.0.1:8000/gw"
    )


def test_run_command_line(tmp_path: Path):
    rt = make(tmp_path, cpus=2, memory_mb=2048, options={"run_args": ["--shm-size", "1g"]})
    assert rt.container.startswith("polar-sess-")
    assert rt.run_argv() == [
        "docker", "run", "-d", "--name", rt.container,
        "--label", "polar.session=sess",
        "--network", "none",
        "--user", "65534:65534", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "--pids-limit", "4096",
        "--cpus", "2", "--memory", "2048m",
        "-v", f"{rt.workspace_path}:/workspace",
        "-v", f"{rt.home_path}:/home/polar",
        "-v", f"{FORWARDER_SOURCE}:/.polar/forwarder.py:ro",
        "-v", f"{rt.run_path}:/.polar/run",
        "-w", "/workspace", "--shm-size", "1g",
        "--entrypoint", "python3", "python:3.12-slim",
        "-I", "-S", "/.polar/forwarder.py", "--tcp", "127.0.0.1:18080",
        "--unix", "/.polar/run/gateway.sock",
    ]  # fmt: skip
    assert rt.gateway_url_inside == "http://127.0.0.1:18080/gw"
    assert rt.capabilities.persistent_processes and rt.capabilities.resource_limits == {
        "cpus",
        "memory",
    }


def test_the_user_is_an_option(tmp_path: Path):
    argv = make(tmp_path, options={"user": "1000:1000"}).run_argv()
    assert argv[argv.index("--user") + 1] == "1000:1000"
    assert "--user" not in make(tmp_path, options={"user": None}).run_argv()


def test_the_workspace_is_handed_to_the_container_user(tmp_path: Path):
    rt = make(tmp_path, files={"pkg/a.py": "x"}, options={"user": "4242:4243"})
    rt._lay_out()
    rt._write_files()
    rt._hand_over(rt.workspace_path, rt.home_path)
    for path in (rt.workspace_path, rt.workspace_path / "pkg", rt.workspace_path / "pkg/a.py"):
        info = path.stat()
        if os.geteuid() == 0:
            assert (info.st_uid, info.st_gid) == (4242, 4243)
        else:
            assert info.st_mode & 0o006 == 0o006


def test_host_network_runs_sleep(tmp_path: Path):
    rt = make(tmp_path, network="host", workdir="/src")
    argv = rt.run_argv()
    assert argv[argv.index("--network") + 1] == "host"
    assert argv[-3:] == ["sleep", "python:3.12-slim", "infinity"]
    assert argv[argv.index("--entrypoint") + 1] == "sleep"
    assert f"{rt.workspace_path}:/src" in argv
    assert rt.gateway_url_inside == "http://127.0.0.1:8000/gw"


def test_exec_kill_cp_rm_command_lines(tmp_path: Path):
    rt = make(tmp_path)
    assert rt.exec_argv(["ls", "-l"], ["HOME", "TOKEN"], "/workspace/a") == [
        "docker", "exec", "-i", "-w", "/workspace/a",
        "-e", EXEC_ID_VAR, "-e", "HOME", "-e", "TOKEN",
        rt.container, "ls", "-l",
    ]  # fmt: skip
    kill = rt.kill_argv(["abc"])
    assert kill[:5] == ["docker", "exec", rt.container, "sh", "-c"] and kill[-2:] == ["sh", "abc"]
    assert rt.cp_argv("/x", f"{rt.container}:/y") == ["docker", "cp", "/x", f"{rt.container}:/y"]
    assert rt.rm_argv() == ["docker", "rm", "-f", rt.container]


def test_env_values_stay_off_the_command_line(tmp_path: Path):
    rt = make(tmp_path, env={"TOKEN": "s3cret"})
    launch = rt._launch(["env"], {"TOKEN": "s3cret", "HOME": "/home/polar"}, "/workspace", "e1")
    assert "s3cret" not in " ".join(launch.argv)
    assert launch.env["TOKEN"] == "s3cret" and launch.env[EXEC_ID_VAR] == "e1"
    assert launch.env["DOCKER_CONFIG"]  # the client keeps its own config despite HOME


def test_an_image_is_required(tmp_path: Path):
    with pytest.raises(ConfigError, match="image"):
        DockerRuntime(RuntimeSpec(kind="docker"), tmp_path, "http://127.0.0.1:1")


@pytest.fixture
def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "docker"
    script.write_text(FAKE_DOCKER.format(python=sys.executable))
    script.chmod(0o755)
    log = tmp_path / "docker.log"
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(log))
    return script


def logged(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "docker.log").read_text().splitlines()]


async def test_exec_flow_through_the_cli(tmp_path: Path, fake_docker: Path):
    rt = make(
        tmp_path, network="host", env={"TOKEN": "s3cret"}, options={"docker": str(fake_docker)}
    )
    await rt.start()
    try:
        result = await rt.exec("echo token=$TOKEN home=$HOME")
        assert result.stdout.strip() == "token=s3cret home=/home/polar"
        began = time.monotonic()
        slow = await rt.exec(["sleep", "30"], timeout_s=0.5)
        assert slow.timed_out and time.monotonic() - began < 10
    finally:
        await rt.stop()
    calls = logged(tmp_path)
    assert calls[0] == rt.run_argv()[1:]
    assert all("s3cret" not in " ".join(call) for call in calls)
    kills = [call for call in calls if call[:4] == ["exec", rt.container, "sh", "-c"]]
    assert len(kills) == 1  # the timed-out exec was killed inside by its tag
    assert calls[-1] == ["rm", "-f", rt.container]


async def test_the_kill_script_ends_tagged_processes_only(tmp_path: Path, fake_docker: Path):
    rt = make(tmp_path, network="host", options={"docker": str(fake_docker)})
    await rt.start()
    tagged = subprocess.Popen(["sleep", "30"], env={**os.environ, EXEC_ID_VAR: "victim"})
    bystander = subprocess.Popen(["sleep", "30"], env={**os.environ, EXEC_ID_VAR: "bystander"})
    try:
        proc = await asyncio.create_subprocess_exec(*rt.kill_argv(["victim"]))
        assert await proc.wait() == 0
        assert tagged.wait(timeout=5) == -9
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        await rt.stop()


async def test_failed_run_raises_with_the_cli_error(tmp_path, fake_docker, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_FAIL", "1")
    rt = make(tmp_path, network="host", options={"docker": str(fake_docker)})
    with pytest.raises(RuntimeStartError, match="Cannot connect to the Docker daemon"):
        await rt.start()
    assert not any(call[0] == "rm" for call in logged(tmp_path))


async def test_an_image_source_is_copied_out_before_the_container_starts(
    tmp_path: Path, fake_docker: Path, monkeypatch: pytest.MonkeyPatch
):
    image_root = tmp_path / "image"
    (image_root / "testbed" / "pkg").mkdir(parents=True)
    (image_root / "testbed" / "pkg" / "a.py").write_text("A = 1\n")
    (image_root / "testbed" / "setup.py").write_text("old")
    monkeypatch.setenv("FAKE_DOCKER_IMAGE_ROOT", str(image_root))
    rt = make(
        tmp_path,
        network="host",
        workdir="/testbed",
        source=ImageSource(kind="image"),
        files={"setup.py": "new"},
        options={"docker": str(fake_docker)},
    )
    await rt.start()
    await rt.stop()
    assert (rt.workspace_path / "pkg" / "a.py").read_text() == "A = 1\n"
    assert (rt.workspace_path / "setup.py").read_text() == "new"
    seed = f"{rt.container}-seed"
    calls = logged(tmp_path)
    assert calls[:4] == [
        rt.seed_create_argv(seed)[1:],
        ["cp", f"{seed}:/testbed/.", str(rt.workspace_path)],
        ["rm", "-f", seed],
        rt.run_argv()[1:],
    ]
    assert calls[0][calls[0].index("--entrypoint") + 1] == "true"  # never started


async def test_a_missing_image_directory_fails_start_and_removes_the_seed_container(
    tmp_path: Path, fake_docker: Path
):
    source = ImageSource(kind="image", path="/nowhere")
    rt = make(tmp_path, network="host", source=source, options={"docker": str(fake_docker)})
    with pytest.raises(RuntimeStartError, match="copying /nowhere out of the image"):
        await rt.start()
    calls = logged(tmp_path)
    assert [call[0] for call in calls] == ["create", "cp", "rm"]


@pytest.mark.slow
async def test_live_docker(tmp_path: Path, gateway_url: str, other_server_url: str):
    if reason := docker_unready():
        pytest.skip(reason)
    rt = DockerRuntime(
        RuntimeSpec(kind="docker", image=IMAGE, files={"a": "1"}), tmp_path / "s", gateway_url
    )
    await rt.start()
    try:
        fetch = f"import urllib.request as u; print(u.urlopen('{rt.gateway_url_inside}/x').read().decode())"
        assert (await rt.exec(["python3", "-c", fetch])).stdout.strip() == "gateway /gw/x"
        other = await rt.exec(
            ["python3", "-c", f"import urllib.request as u; u.urlopen('{other_server_url}')"]
        )
        assert other.exit_code != 0
        assert (await rt.exec("cat a; touch /usr/x")).stdout == "1"
    finally:
        await rt.stop()


@pytest.mark.slow
async def test_live_docker_runs_unprivileged_in_a_writable_workspace(
    tmp_path: Path, gateway_url: str
):
    if reason := docker_unready():
        pytest.skip(reason)
    rt = DockerRuntime(
        RuntimeSpec(kind="docker", image=IMAGE, files={"pkg/a": "1"}), tmp_path / "s", gateway_url
    )
    await rt.start()
    try:
        result = await rt.exec(
            "id -u; grep CapEff /proc/self/status; echo x >> pkg/a; echo y > new;"
            " echo z > $HOME/cfg; cat /etc/shadow >/dev/null 2>&1; echo shadow=$?"
        )
        lines = result.stdout.split("\n")
        assert lines[0] == "65534", result.stdout + result.stderr
        assert lines[1].split()[-1] == "0000000000000000"
        assert lines[2] == "shadow=1"
        assert (rt.workspace_path / "pkg/a").read_text() == "1x\n"
        assert (rt.home_path / "cfg").read_text() == "z\n"
        local = tmp_path / "up"
        (local / "d").mkdir(parents=True)
        (local / "d" / "f").write_text("u")
        await rt.upload(local, "uploaded")
        assert (await rt.exec("echo v >> uploaded/d/f && touch uploaded/d/g")).ok
    finally:
        await rt.stop()
