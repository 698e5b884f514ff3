"""What descriptors a harness holds, live: a real ``polar serve-gateway`` node process (uvicorn's
default loop, uvloop where installed) runs a session whose harness lists ``/proc/self/fd``
from inside, in every runtime this machine can run. Before the fix the node's listening socket
was inheritable and uvloop ignores ``close_fds``, so a harness could ``accept()`` the rollout
server's dispatches (the node credential included); under Ray the worker's ~20 log files,
opened without close-on-exec, leaked the same way. The node here is started once as plainly as
``polar serve-gateway`` and once holding such inherited descriptors (files and a socket)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from images.local_image import IMAGE, docker_unready
from polar.gateway.server import BackgroundServer
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig
from polar.schemas.task import SessionResult, SessionStatus

pytestmark = pytest.mark.slow

# Runs inside the sandbox: the descriptors open in this process (listdir's own is closed by the
# time each one is checked, so it drops out).
PROBE = """
import json, os
listed = [int(name) for name in os.listdir("/proc/self/fd")]
open_fds = []
for fd in listed:
    try:
        os.fstat(fd)
    except OSError:
        continue
    open_fds.append(fd)
with open("fds.json", "w") as out:
    json.dump(sorted(open_fds), out)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _runtime(kind: str) -> dict[str, Any]:
    files = {"probe.py": PROBE}
    if kind == "bubblewrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) not installed")
    if kind == "docker":
        if reason := docker_unready():
            pytest.skip(reason)
        return {"kind": "docker", "image": IMAGE, "files": files}
    return {"kind": kind, "files": files}


@pytest.fixture
def rollout(tmp_path: Path) -> Iterator[tuple[str, str]]:
    config = RolloutServerConfig(
        data_dir=tmp_path / "rollout", port=_free_port(), dispatch_interval_s=0.02
    )
    app = create_rollout_app(config)
    server = BackgroundServer(app, port=config.port).start()
    yield server.url, app.state.service.access.admin_token
    server.stop()


def _start_node(tmp: Path, rollout: tuple[str, str], held: list[int]) -> subprocess.Popen[bytes]:
    """``polar serve-gateway`` as a node of ``rollout``, inheriting the descriptors ``held``."""
    url, token = rollout
    config = {
        "port": 0,
        "capture_db": str(tmp / "node" / "captures.db"),
        "served_model": "SmolLM2-135M-Instruct",
        "engine": {"kind": "scripted"},
        "node": {
            "node_id": "fds",
            "work_dir": str(tmp / "node" / "sessions"),
            "rollout_url": url,
            "rollout_token": token,
            "heartbeat_s": 0.2,
        },
    }
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = Path(sys.executable).with_name("polar")
    return subprocess.Popen(
        [str(cli), "serve-gateway", "--config", str(path)],
        pass_fds=held,
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "node.log").open("wb"),
    )


def _wait_node(url: str, token: str, proc: subprocess.Popen[bytes], tmp: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp / "node.log").read_text()
        nodes = httpx.get(f"{url}/nodes", headers={"authorization": f"Bearer {token}"}).json()
        if any(node["healthy"] for node in nodes):
            return
        time.sleep(0.2)
    raise AssertionError("the node never registered: " + (tmp / "node.log").read_text())


def _harness_fds(tmp: Path, rollout: tuple[str, str], kind: str) -> list[int]:
    url, token = rollout
    auth = {"authorization": f"Bearer {token}"}
    task = {
        "task_id": f"fds-{kind}",
        "instruction": "list your descriptors",
        "num_samples": 1,
        "timeout_seconds": 60,
        "runtime": _runtime(kind),
        "agent": {"harness": "shell", "settings": {"command": "python3 probe.py"}},
        "evaluator": {"strategy": "test_on_output", "config": {"command": "test -f fds.json"}},
    }
    reply = httpx.post(f"{url}/tasks", json=task, headers=auth, timeout=10)
    assert reply.status_code == 201, reply.text
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        got = httpx.get(f"{url}/tasks/fds-{kind}", headers=auth, timeout=10).json()
        if got["status"] == "COMPLETED":
            break
        time.sleep(0.2)
    [raw] = got["results"]
    result = SessionResult.model_validate(raw)
    assert result.status == SessionStatus.COMPLETED, result.error
    report = Path(str(result.session_dir)) / "workspace" / "fds.json"
    return list(json.loads(report.read_text()))


def _inheritable_descriptors(tmp: Path) -> list[int]:
    """What a Ray worker holds: log files opened without close-on-exec, and a listening socket
    (duplicated, so the descriptor is ours to close)."""
    held = []
    for index in range(3):
        fd = os.open(tmp / f"ray-{index}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.set_inheritable(fd, True)
        held.append(fd)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        held.append(os.dup(listener.fileno()))
    return held


@pytest.mark.parametrize("inherited", [False, True], ids=["plain", "with-inherited-fds"])
@pytest.mark.parametrize("kind", ["local", "bubblewrap", "docker"])
def test_a_harness_sees_only_its_stdio(
    tmp_path: Path, rollout: tuple[str, str], kind: str, inherited: bool
) -> None:
    _runtime(kind)  # skip before starting anything
    held = _inheritable_descriptors(tmp_path) if inherited else []
    node = _start_node(tmp_path, rollout, held)
    for fd in held:
        os.close(fd)
    try:
        _wait_node(*rollout, node, tmp_path)
        assert _harness_fds(tmp_path, rollout, kind) == [0, 1, 2]
    finally:
        node.terminate()
        node.wait(30)
