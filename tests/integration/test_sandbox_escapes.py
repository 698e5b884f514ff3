"""A sandboxed session tries to leave its sandbox (issue 14): one live test per runtime, the same
escapes from bubblewrap and from docker.

A real rollout server and gateway node (with an admin token) dispatch a ``shell`` session whose
harness is ``escape_probe.py``. From inside it lists sessions, reads the docs, calls with another
live session's key (in the path, a header, the query), dispatches a ``local`` task to the node,
pauses the engine, posts a forged result, and calls the node and rollout server directly. The
model-API view refuses what goes through the relay (403/404, never the gateway's own 401: the
gateway never sees it), the rest is unreachable, and nothing changed outside; the session's own
model call works and is captured, and the harness is not root.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from images.local_image import IMAGE, docker_unready
from integration.rollout_support.cluster import Cluster, shell_task, start_cluster
from polar.schemas.task import SessionResult, SessionStatus

pytestmark = pytest.mark.slow

PROBE = Path(__file__).parent.joinpath("rollout_support", "escape_probe.py").read_text()
TOKEN = "admin-secret"
VICTIM = "victim-session-0123456789"
THROUGH_THE_RELAY = {
    "list_sessions": 404,
    "list_sessions_own_prefix": 404,
    "docs": 404,
    "openapi": 404,
    "victim_key_in_path": 403,
    "victim_key_in_bearer": 403,
    "victim_key_in_x_api_key": 403,
    "victim_key_in_query": 403,
    "node_dispatch": 404,
    "node_status": 404,
    "pause": 404,
    "rollout_route_via_relay": 404,
    "forged_result_via_relay": 404,
}
UNREACHABLE = ("node_direct", "rollout_direct", "forged_result_direct")


def _runtime(kind: str) -> dict[str, Any]:
    files = {"escape_probe.py": PROBE}
    if kind == "bubblewrap":
        if shutil.which("bwrap") is None:
            pytest.skip("bubblewrap (bwrap) not installed")
        return {"kind": "bubblewrap", "files": files}
    if reason := docker_unready():
        pytest.skip(reason)
    return {"kind": "docker", "image": IMAGE, "files": files}


@pytest.fixture
def cluster(tmp_path: Path, tokenizer: Any) -> Iterator[Cluster]:
    c = start_cluster(tmp_path, tokenizer, node_ids=("a",), admin_token=TOKEN)
    yield c
    c.stop()


@pytest.mark.parametrize("kind", ["bubblewrap", "docker"])
def test_a_sandboxed_session_reaches_its_own_model_api_only(cluster: Cluster, kind: str) -> None:
    runtime = _runtime(kind)
    node = cluster.nodes["a"]
    admin = {"authorization": f"Bearer {TOKEN}"}
    victim = httpx.post(
        f"{node.url}/polar/sessions", json={"session_id": VICTIM}, headers=admin, timeout=10
    )
    assert victim.status_code == 201, victim.text
    env = {"VICTIM_KEY": VICTIM, "NODE_URL": node.url, "ROLLOUT_URL": cluster.url}
    task = shell_task(
        "escape",
        cluster.receiver,
        num_samples=1,
        timeout_s=60,
        agent_env=env,
        runtime=runtime,
        evaluator={"strategy": "test_on_output", "config": {"command": "cat escapes.json"}},
    )
    task["agent"]["settings"]["command"] = "python3 escape_probe.py"
    assert cluster.submit(task).status_code == 201
    [result] = [SessionResult.model_validate(r) for r in cluster.wait_task("escape")["results"]]
    assert result.status == SessionStatus.COMPLETED, result.error
    report = json.loads(result.metadata["evaluation"]["output_tail"])
    got = {name: found["got"] for name, found in report["attempts"].items()}

    assert {name: got[name] for name in THROUGH_THE_RELAY} == THROUGH_THE_RELAY, report
    assert {name: got[name] for name in UNREACHABLE} == dict.fromkeys(UNREACHABLE, "unreachable")
    assert not [name for name, found in report["attempts"].items() if found["leaks_victim"]]
    assert got["own_call"] == 200, report["attempts"]["own_call"]
    assert report["uid"] != 0 and not report["shadow_readable"]

    # Its own call was captured under its own key; nothing reached the victim or the controls.
    assert len(node.store.records(result.session_id)) == 1
    assert node.store.records(VICTIM) == []
    status = httpx.get(f"{node.url}/polar/status", headers=admin, timeout=10).json()
    assert status["paused"] is False
    tasks = httpx.get(f"{cluster.url}/tasks", headers=admin, timeout=10).json()
    assert [t["task_id"] for t in tasks] == ["escape"]
    assert not Path("/tmp/polar-escaped").exists()
