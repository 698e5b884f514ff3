"""A harness that plants a trap for the host costs only its own session: on a real node (one
post-run worker, so a single wedged post-run would stop it), harnesses plant a FIFO, a device
node (where this machine lets them), a terabyte sparse file, a 60-link symlink chain, a directory link to the host's ``/etc`` or more
files than a walk visits, under every evaluator (``session_completed``, ``test_on_output`` in a
fresh runtime, ``swe_tests`` on a bundled SWE task), in bubblewrap where it is installed and
the local runtime otherwise. Every trapped session finishes, and an honest session after them
still runs to COMPLETED. Before, ``swe_tests``'s diff opened the FIFO and its post-run worker
blocked in ``open()`` for good."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.rollout_support.cluster import Cluster, start_cluster
from polar.schemas.task import SessionResult, SessionStatus, TaskRequest
from polar.swe.bundled import bundle_repos, bundled_instances
from polar.swe.tasks import SWETaskOptions, instance_task

pytestmark = pytest.mark.slow

TRAPS = {
    "fifo": "mkfifo trap",
    "device": "mknod trap c 1 5 || true",  # refused inside bubblewrap (no CAP_MKNOD)
    "sparse": "truncate -s 1T trap",
    "chain": 'touch end; p=end; for i in $(seq 60); do ln -s "$p" "c$i"; p="c$i"; done; '
    'ln -s "$p" trap',
    "many": "mkdir many && cd many && seq 1500 | xargs touch",
    # a directory link out (the host's /etc): nothing beneath it is read on the host
    "dir_link": "ln -s /etc sub && mkdir -p src && ln -s /etc/hostname src/hostname",
}
WALK_LIMIT = 1000  # entries a walk visits here (200,000 by default): "many" goes past it


def runtime_kind() -> str:
    return "bubblewrap" if shutil.which("bwrap") else "local"


@pytest.fixture
def cluster(tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    monkeypatch.setattr("polar.runtimes.safe_files.MAX_ENTRIES", WALK_LIMIT)
    workers = {"init_workers": 2, "run_workers": 2, "ready_buffer": 2, "postrun_workers": 1}
    c = start_cluster(tmp_path, tokenizer, node_ids=("a",), workers=workers)
    yield c
    c.stop()


def task(evaluator: str, task_id: str, command: str, tmp: Path) -> dict[str, Any]:
    """A session of ``command`` under ``evaluator``, as the TaskRequest the trainer sends."""
    if evaluator == "swe_tests":
        instance = next(i for i in bundled_instances() if "textkit" in i.instance_id)
        options = SWETaskOptions(
            runtime=runtime_kind(),
            repos={repo: str(path) for repo, path in bundle_repos(tmp / "bundles").items()},
            harness="shell",
            settings={"command": command},
            timeout_s=120,
            test_timeout_s=60,
        )
        request = instance_task(instance, options, task_id=task_id)
    else:
        request = TaskRequest.model_validate(
            {
                "task_id": task_id,
                "instruction": "x",
                "timeout_seconds": 120,
                "runtime": {"kind": runtime_kind()},
                "agent": {"harness": "shell", "settings": {"command": command}},
                "evaluator": {
                    "strategy": evaluator,
                    "refresh_runtime": evaluator == "test_on_output",
                    "config": {"command": "true"} if evaluator == "test_on_output" else {},
                },
            }
        )
    return request.model_dump(mode="json")


def finish(cluster: Cluster, task_id: str) -> SessionResult:
    [raw] = cluster.wait_task(task_id, timeout_s=180)["results"]
    return SessionResult.model_validate(raw)


@pytest.mark.parametrize("evaluator", ["session_completed", "test_on_output", "swe_tests"])
def test_planted_traps_cost_only_their_own_session(
    cluster: Cluster, tmp_path: Path, evaluator: str
) -> None:
    for trap, command in TRAPS.items():
        reply = cluster.submit(task(evaluator, f"trap-{trap}", command, tmp_path))
        assert reply.status_code == 201, reply.text
    ended = {trap: finish(cluster, f"trap-{trap}") for trap in TRAPS}
    for trap, result in ended.items():
        assert result.status.finished, (trap, result)
        if trap == "many" and evaluator != "session_completed":
            # More files than a walk visits: the grader refuses the tree, this session fails.
            assert result.status == SessionStatus.ERROR, result
            assert result.failure is not None and result.failure.kind == "evaluator"
            assert "more than 1000 entries" in (result.error or "")
        else:
            assert result.status == SessionStatus.COMPLETED, (trap, result.error)

    reply = cluster.submit(task(evaluator, "honest", "echo done > done.txt", tmp_path))
    assert reply.status_code == 201, reply.text
    assert finish(cluster, "honest").status == SessionStatus.COMPLETED
