"""Real NeMo Gym 0.7.0 beside a live Polar stack, all on loopback: the cached Gym venv, a private
Ray head, ``ng_run`` and ``ng_collect_rollouts`` as process groups this test owns.

nemo-gym >= 0.5 declares Python >= 3.13.14; this image has 3.13.0, on which 0.7.0 installs
with ``--ignore-requires-python`` and runs (docs/nemo_gym.md). The venv (~1.4 GB, ~4 min to
install from PyPI) is cached outside the repository, under Polar's cache root.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from polar.rendering.model_files import cache_dir

GYM_VERSION = "0.7.0"
REPO = Path(__file__).resolve().parents[2]
SEARCH_ROOT = REPO / "integrations/nemo_gym"
AGENT_CONFIG = SEARCH_ROOT / "responses_api_agents/polar_agent/configs/polar_agent.yaml"
READY = ".polar-ready"
# The server directories ng_run starts, each given the one prebuilt venv (Gym installs nothing).
SERVER_DIRS = (
    "responses_api_agents/polar_agent",
    "environment_servers/legacy_agent",
    "resources_servers/string_match",
)


class Unavailable(Exception):
    """Something this machine lacks (the test skips, saying what)."""


def python313() -> str:
    """A Python 3.13 interpreter: ``$POLAR_GYM_PYTHON``, else pyenv's 3.13.x, else
    ``python3.13`` on PATH, each only if it really runs (pyenv's shim may not)."""
    candidates = [os.environ.get("POLAR_GYM_PYTHON", "")]
    pyenv = shutil.which("pyenv")
    if pyenv:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip()
        candidates += sorted(glob.glob(f"{root}/versions/3.13.*/bin/python"), reverse=True)
    candidates.append(shutil.which("python3.13") or "")
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 13))"],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return candidate
    raise Unavailable(
        "no Python 3.13 interpreter (set POLAR_GYM_PYTHON, or install 3.13 with pyenv): "
        f"nemo-gym {GYM_VERSION} needs it"
    )


def gym_venv() -> Path:
    """The cached venv with nemo-gym (made once, under a lock; a half-made one is redone)."""
    venv = cache_dir() / f"gym-venv-{GYM_VERSION}"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / READY).exists():
            return venv
        python = python313()
        shutil.rmtree(venv, ignore_errors=True)
        print(f"nemo_gym: installing nemo-gym=={GYM_VERSION} into {venv} (~4 min)", flush=True)
        steps = [
            [python, "-m", "venv", str(venv)],
            [str(venv / "bin/python"), "-m", "pip", "install", "--quiet",
             "--ignore-requires-python", f"nemo-gym=={GYM_VERSION}"],
        ]  # fmt: skip
        for step in steps:
            try:
                done = subprocess.run(step, capture_output=True, text=True, timeout=1500)
            except subprocess.TimeoutExpired as exc:
                raise Unavailable(f"installing nemo-gym=={GYM_VERSION} took over 25 min") from exc
            if done.returncode != 0:
                tail = (done.stderr or done.stdout)[-1500:]
                raise Unavailable(f"could not install nemo-gym=={GYM_VERSION}: {tail}")
        (venv / READY).write_text(GYM_VERSION)
        return venv


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment minus our Python's, plus Ray's quiet settings."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    }
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0", **extra)
    return env


@dataclass
class Group:
    """A process started in its own session: stopped by its process group, never by name."""

    process: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, needle: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while needle not in self.text():
            if self.process.poll() is not None:
                raise AssertionError(f"exited {self.process.returncode}: {self.text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {needle!r} in {timeout_s:g} s: {self.text()[-3000:]}")
            time.sleep(0.5)

    def stop(self, grace_s: float = 10.0) -> None:
        pgid = self.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def start_group(argv: list[str], log: Path, cwd: Path, env: dict[str, str]) -> Group:
    out = open(log, "wb")  # noqa: SIM115 -- the child keeps writing after we return
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    return Group(process, log)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def ray_head(venv: Path) -> Iterator[str]:
    """A private Ray head on 127.0.0.1 with its own short temp dir (Ray's socket paths must
    stay under 108 bytes); a bare ray.init() would join any cluster on this host."""
    temp = Path(tempfile.mkdtemp(prefix="pgr-", dir="/tmp"))
    port = free_port()
    head = start_group(
        [str(venv / "bin/ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
         f"--port={port}", f"--temp-dir={temp}", "--num-cpus=2", "--include-dashboard=false",
         "--disable-usage-stats"],
        temp / "head.log", temp, clean_env(),
    )  # fmt: skip
    try:
        head.wait_for("will now block", timeout_s=120)
        yield f"127.0.0.1:{port}"
    finally:
        head.stop()
        shutil.rmtree(temp, ignore_errors=True)


def server_venvs(venv: Path, root: Path) -> Path:
    """``uv_venv_dir`` with each server's ``.venv`` linked to the cached venv."""
    for server in SERVER_DIRS:
        (root / server).mkdir(parents=True, exist_ok=True)
        (root / server / ".venv").symlink_to(venv, target_is_directory=True)
    return root


def gym_python(venv: Path) -> str:
    return str(venv / "bin/python")


def run_in_gym(venv: Path, script: str, *args: str) -> str:
    """Run ``script`` with the Gym venv's Python (Gym's own checks on our output)."""
    done = subprocess.run(
        [gym_python(venv), "-c", script, *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
