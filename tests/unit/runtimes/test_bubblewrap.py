"""Bubblewrap: the command line it builds, and live sandboxes on this machine."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from polar.errors import ConfigError
from polar.runtimes.bubblewrap import BubblewrapRuntime
from polar.runtimes.gateway_relay import FORWARDER_INSIDE
from polar.schemas.task import RuntimeSpec

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")

PROBE = """
import json, socket, sys, urllib.request
def attempt(fn):
    try:
        return fn()
    except Exception as exc:
        return "refused: " + type(exc).__name__
report = {
    "gateway": attempt(lambda: urllib.request.urlopen(sys.argv[1] + "/ping", timeout=5).read().decode()),
    "other_loopback": attempt(lambda: urllib.request.urlopen(sys.argv[2], timeout=2).read().decode()),
    "internet": attempt(lambda: socket.create_connection(("1.1.1.1", 80), timeout=2).close() or "connected"),
}
print(json.dumps(report))
"""


def make(tmp_path: Path, gateway_url: str, **spec: object) -> BubblewrapRuntime:
    return BubblewrapRuntime(RuntimeSpec(kind="bubblewrap", **spec), tmp_path / "s", gateway_url)


def pair(argv: list[str], flag: str, *values: str) -> bool:
    """Whether ``flag value...`` appears in argv."""
    width = 1 + len(values)
    return any(argv[i : i + width] == [flag, *values] for i in range(len(argv)))


def test_command_line_isolates_and_maps_the_session(tmp_path: Path):
    rt = make(tmp_path, "http://127.0.0.1:8000/x", options={"ro_binds": ["/opt/node", "/a:/b"]})
    argv = rt.bwrap_argv("/workspace/sub")
    assert argv[0] == "bwrap" and argv[-1] == "--"
    assert pair(argv, "--ro-bind", "/usr", "/usr") and not pair(argv, "--ro-bind", "/etc", "/etc")
    assert pair(argv, "--ro-bind", "/etc/hosts", "/etc/hosts")
    assert pair(argv, "--ro-bind", str(rt.run_path / "etc" / "passwd"), "/etc/passwd")
    assert pair(argv, "--remount-ro", "/etc")
    assert not any("shadow" in arg or "ssl/private" in arg for arg in argv)
    assert pair(argv, "--unshare-user", "--uid", "65534", "--gid", "65534")
    assert pair(argv, "--cap-drop", "ALL")
    assert pair(argv, "--bind", str(rt.workspace_path), "/workspace")
    assert pair(argv, "--bind", str(rt.home_path), "/home/polar")
    assert pair(argv, "--proc", "/proc") and pair(argv, "--dev", "/dev")
    assert pair(argv, "--tmpfs", "/tmp") and pair(argv, "--chdir", "/workspace/sub")
    assert pair(argv, "--ro-bind", "/opt/node", "/opt/node") and pair(argv, "--ro-bind", "/a", "/b")
    python_root = os.path.realpath(sys.base_prefix)
    if not python_root.startswith("/usr/"):
        assert pair(argv, "--ro-bind", python_root, python_root)
    for flag in ("--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net"):
        assert flag in argv
    assert rt.gateway_url_inside == "http://127.0.0.1:18080/x"
    assert rt.capabilities.network_isolation and rt.capabilities.filesystem_isolation


def test_host_network_keeps_the_gateway_url(tmp_path: Path):
    rt = make(tmp_path, "http://127.0.0.1:8000/x", network="host")
    assert "--unshare-net" not in rt.bwrap_argv("/workspace")
    assert FORWARDER_INSIDE not in rt.bwrap_argv("/workspace")
    assert rt.gateway_url_inside == "http://127.0.0.1:8000/x"
    assert not rt.capabilities.network_isolation


def test_launch_wraps_limits_outside_and_the_forwarder_inside(tmp_path: Path):
    rt = make(tmp_path, "http://127.0.0.1:8000", cpus=1.5, memory_mb=512)
    argv = rt._launch(["echo", "hi"], {}, "/workspace", "id").argv
    assert argv[:2] == ["taskset", "-c"] and argv[3:6] == ["prlimit", f"--as={512 << 20}", "--"]
    assert len(argv[2].split(",")) == 2  # 1.5 cpus round up to two pinned cores
    inner = argv[argv.index("--", 6) + 1 :]
    assert inner[1:3] == ["-I", "-S"] and inner[3] == FORWARDER_INSIDE
    assert inner[-3:] == ["--", "echo", "hi"]


def test_images_are_refused(tmp_path: Path):
    with pytest.raises(ConfigError, match="image"):
        make(tmp_path, "http://127.0.0.1:1", image="python:3.11")


@pytest.fixture
async def sandbox(tmp_path: Path, gateway_url: str) -> AsyncIterator[BubblewrapRuntime]:
    rt = make(tmp_path, gateway_url, files={"hello.txt": "hi"}, cpus=1, memory_mb=1024)
    await rt.start()
    yield rt
    await rt.stop()


@needs_bwrap
async def test_only_the_gateway_is_reachable(sandbox: BubblewrapRuntime, other_server_url: str):
    result = await sandbox.exec(
        ["python", "-c", PROBE, sandbox.gateway_url_inside, other_server_url]
    )
    assert result.ok, result.stderr
    report = json.loads(result.stdout)
    assert report["gateway"] == "gateway /gw/ping"
    assert report["other_loopback"].startswith("refused")
    assert report["internet"].startswith("refused")


@needs_bwrap
async def test_host_network_mode_reaches_host_loopback(tmp_path, gateway_url, other_server_url):
    rt = make(tmp_path, gateway_url, network="host")
    await rt.start()
    try:
        result = await rt.exec(["python", "-c", PROBE, rt.gateway_url_inside, other_server_url])
        report = json.loads(result.stdout)
        assert report["gateway"] == "gateway /gw/ping"
        assert report["other_loopback"] == "other /"
    finally:
        await rt.stop()


@needs_bwrap
async def test_system_is_read_only_and_the_session_dirs_are_writable(sandbox: BubblewrapRuntime):
    result = await sandbox.exec(
        "touch /usr/x; echo usr=$?; touch /etc/x; echo etc=$?;"
        "echo agent > made.txt; echo cfg > $HOME/.cfg; cat hello.txt; echo; pwd; echo $HOME"
    )
    lines = result.stdout.split()
    assert lines[:2] == ["usr=1", "etc=1"], result.stdout
    assert lines[2:] == ["hi", "/workspace", "/home/polar"]
    assert "Read-only file system" in result.stderr
    assert (sandbox.workspace_path / "made.txt").read_text() == "agent\n"
    assert (sandbox.home_path / ".cfg").read_text() == "cfg\n"


@needs_bwrap
async def test_processes_are_private_and_end_with_their_exec(sandbox: BubblewrapRuntime):
    await sandbox.exec("(sleep 30 &) ; echo started")
    pids = (await sandbox.exec("ls /proc | grep -c '^[0-9]'")).stdout.strip()
    assert int(pids) < 10  # the host's processes are invisible; earlier execs are gone


@needs_bwrap
async def test_timeout_kills_everything_in_the_sandbox(sandbox: BubblewrapRuntime):
    began = time.monotonic()
    result = await sandbox.exec(
        "(while true; do date +%s%N >> beat; sleep 0.05; done) & sleep 30", timeout_s=0.7
    )
    assert result.timed_out and time.monotonic() - began < 6
    size = (sandbox.workspace_path / "beat").stat().st_size
    await asyncio.sleep(0.25)
    assert (sandbox.workspace_path / "beat").stat().st_size == size


@needs_bwrap
async def test_limits_apply_inside(sandbox: BubblewrapRuntime):
    allowed = await sandbox.exec("grep Cpus_allowed_list /proc/self/status")
    assert allowed.stdout.split()[-1].isdigit()
    hog = await sandbox.exec(["python", "-c", "b = bytearray(1536 * 1024 * 1024)"])
    assert hog.exit_code != 0 and "MemoryError" in hog.stderr


@needs_bwrap
async def test_transfers_map_workdir_and_home(sandbox: BubblewrapRuntime, tmp_path: Path):
    local = tmp_path / "in.txt"
    local.write_text("payload")
    await sandbox.upload(local, "/home/polar/.config/in.txt")
    await sandbox.upload(local, "nested/in.txt")
    result = await sandbox.exec("cat ~/.config/in.txt /workspace/nested/in.txt")
    assert result.stdout == "payloadpayload"
    await sandbox.download("/workspace/hello.txt", tmp_path / "out.txt")
    assert (tmp_path / "out.txt").read_text() == "hi"
    with pytest.raises(ValueError, match="outside"):
        await sandbox.upload(local, "/tmp/x")


@needs_bwrap
async def test_the_sandbox_user_is_unprivileged_and_sees_no_host_secrets(
    sandbox: BubblewrapRuntime, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("POLAR_HOST_MARKER", "host-secret")
    result = await sandbox.exec(
        "id -u; id -g; id -un; grep CapEff /proc/self/status;"
        " cat /etc/shadow >/dev/null 2>&1; echo shadow=$?; test -e /etc/shadow; echo exists=$?;"
        " echo root=$(ls -A /root 2>/dev/null | tr '\\n' ' '); env"
    )
    lines = result.stdout.splitlines()
    assert lines[:3] == ["65534", "65534", "polar"], result.stdout + result.stderr
    assert lines[3].split()[-1] == "0000000000000000"
    assert lines[4:6] == ["shadow=1", "exists=1"]
    # Only the bound interpreter's directories show under /root (pyenv installs live there).
    python_tops = {
        Path(d).relative_to("/root").parts[0]
        for d in sandbox._python_dirs()
        if d.startswith("/root/")
    }
    assert set(lines[6].removeprefix("root=").split()) <= python_tops
    assert "host-secret" not in result.stdout
    env = dict(line.split("=", 1) for line in lines[7:] if "=" in line)
    assert env["HOME"] == "/home/polar" and env["USER"] == "polar"


@needs_bwrap
async def test_a_model_api_is_served_in_place_of_the_gateway(tmp_path: Path, gateway_url: str):
    async def model_api(scope, receive, send):  # type: ignore[no-untyped-def]
        body = f"view {scope['method']} {scope['path']}".encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    rt = BubblewrapRuntime(
        RuntimeSpec(kind="bubblewrap"), tmp_path / "s", gateway_url, model_api=model_api
    )
    assert rt.gateway_url_inside == "http://127.0.0.1:18080"  # no path, plain HTTP
    await rt.start()
    try:
        result = await rt.exec(
            ["python", "-c", PROBE, rt.gateway_url_inside + "/gw", "http://127.0.0.1:1"]
        )
        assert result.ok, result.stderr
        assert json.loads(result.stdout)["gateway"] == "view GET /gw/ping"
    finally:
        await rt.stop()
    assert not (rt.relay and (rt.relay.host_dir / "gateway.sock").exists())


@needs_bwrap
async def test_transfers_never_follow_a_planted_link_out_of_the_workspace(
    tmp_path: Path, gateway_url: str
):
    """The harness owns the workspace; the node's transfers run with host rights."""
    secret = tmp_path / "host-secret"
    secret.write_text("root only")
    outside = tmp_path / "host-dir"
    outside.mkdir()
    rt = make(tmp_path, gateway_url)
    await rt.start()
    try:
        (rt.workspace_path / "leak").symlink_to(secret)
        (rt.workspace_path / "tests").symlink_to(outside, target_is_directory=True)
        payload = tmp_path / "payload.txt"
        payload.write_text("written by an evaluator")
        with pytest.raises(ValueError, match="symbolic link"):
            await rt.download("leak", tmp_path / "copied")
        with pytest.raises(ValueError, match="symbolic link"):
            await rt.upload(payload, "tests/test_x.py")
        assert not (tmp_path / "copied").exists() and list(outside.iterdir()) == []
        (rt.workspace_path / "inner").symlink_to(rt.workspace_path / "real.txt")
        (rt.workspace_path / "real.txt").write_text("fine")
        await rt.download("real.txt", tmp_path / "ok.txt")  # links inside stay allowed
        assert (tmp_path / "ok.txt").read_text() == "fine"
    finally:
        await rt.stop()
