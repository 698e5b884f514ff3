"""The sandbox boundary, live: a session dispatched through a real rollout server and gateway
node tries every escape from inside, as a harness could, the same attempts from bubblewrap and
from docker (on the locally built image, tests/images). It reaches its own session's
model API and nothing else, runs unprivileged, and sees no host secret."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from images.local_image import IMAGE, docker_unready
from integration.rollout_support.cluster import Cluster, start_cluster
from polar.schemas.task import SessionResult, SessionStatus

pytestmark = pytest.mark.slow

ADMIN = "admin-secret"
VICTIM = "victim-session-0001"
MARKER = "POLAR_TEST_HOST_MARKER"

# Runs inside the sandbox (stdlib only): every attempt's HTTP status, or why it got none.
PROBE = """
import json, os, subprocess, sys, urllib.error, urllib.request

base = os.environ["OPENAI_BASE_URL"]
root = base.split("/s/")[0]
key = os.environ["OPENAI_API_KEY"]
victim, rollout, node, admin = sys.argv[1:5]
chat = {"model": "polar", "messages": [{"role": "user", "content": "hi"}]}
messages = {"model": "polar", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
local_task = {
    "task_id": "escaped",
    "instruction": "x",
    "runtime": {"kind": "local"},
    "agent": {"harness": "shell", "settings": {"command": "touch /tmp/polar-escaped"}},
}
forged = {"session_id": key, "task_id": "escape", "status": "COMPLETED", "reward": 1.0}


def http(method, url, body=None, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except Exception as exc:
        return "unreachable: " + type(exc).__name__


def readable(path):
    try:
        open(path, "rb").read(1)
        return True
    except OSError:
        return False


as_admin = {"authorization": "Bearer " + admin}
report = {
    "own_call": http("POST", base + "/chat/completions", chat, {"authorization": "Bearer " + key}),
    "list_sessions": http("GET", root + "/polar/sessions"),
    "list_sessions_with_admin_token": http("GET", root + "/polar/sessions", headers=as_admin),
    "session_records": http("GET", root + "/polar/sessions/" + victim + "/records"),
    "docs": http("GET", root + "/docs"),
    "openapi": http("GET", root + "/openapi.json"),
    "redoc": http("GET", root + "/redoc"),
    "health": http("GET", root + "/health"),
    "other_key_in_path": http("POST", root + "/s/" + victim + "/v1/chat/completions", chat),
    "other_key_in_bearer": http(
        "POST", root + "/v1/chat/completions", chat, {"authorization": "Bearer " + victim}
    ),
    "other_key_in_x_api_key": http("POST", root + "/v1/messages", messages, {"x-api-key": victim}),
    "other_key_in_query": http("POST", root + "/v1beta/models/m:generateContent?key=" + victim, {}),
    "dispatch": http("POST", root + "/polar/node/sessions", {"session_id": "x"}, as_admin),
    "node_status": http("GET", root + "/polar/node/status", headers=as_admin),
    "pause": http("POST", root + "/polar/pause", {}, as_admin),
    "rollout_server": http("GET", rollout + "/nodes", headers=as_admin),
    "submit_direct": http("POST", rollout + "/tasks", local_task, as_admin),
    "forged_result_direct": http("POST", rollout + "/results", forged, as_admin),
    "submit_via_relay": http("POST", root + "/tasks", local_task, as_admin),
    "forged_result_via_relay": http("POST", root + "/results", forged, as_admin),
    "node_direct": http("GET", node + "/polar/sessions", headers=as_admin),
    "uid": os.getuid(),
    "id_u": subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip(),
    "shadow_readable": readable("/etc/shadow"),
    "gshadow_readable": readable("/etc/gshadow"),
    "marker": os.environ.get(sys.argv[5]),
}
with open("report.json", "w") as out:
    json.dump(report, out)
"""


def runtime(kind: str, files: dict[str, str]) -> dict[str, Any]:
    """The task's runtime of ``kind``, or a skip saying why it cannot run here."""
    if kind == "bubblewrap":
        if shutil.which("bwrap") is None:
            pytest.skip("bubblewrap (bwrap) not installed")
        return {"kind": "bubblewrap", "files": files}
    if reason := docker_unready():
        pytest.skip(reason)
    return {"kind": "docker", "image": IMAGE, "files": files}


@pytest.fixture
def cluster(tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    monkeypatch.setenv(MARKER, "the-node-host-environment")
    c = start_cluster(tmp_path, tokenizer, node_ids=("a",), admin_token=ADMIN)
    yield c
    c.stop()


@pytest.mark.parametrize("kind", ["bubblewrap", "docker"])
def test_a_sandboxed_harness_reaches_its_own_model_api_and_nothing_else(
    cluster: Cluster, kind: str
) -> None:
    node = cluster.nodes["a"]
    auth = {"authorization": f"Bearer {ADMIN}"}
    made = httpx.post(
        f"{node.url}/polar/sessions", json={"session_id": VICTIM}, headers=auth, timeout=10
    )
    assert made.status_code == 201, made.text
    command = f"python3 probe.py {VICTIM} {cluster.url} {node.url} {ADMIN} {MARKER}"
    task = {
        "task_id": "escape",
        "instruction": "probe",
        "num_samples": 1,
        "timeout_seconds": 60,
        "runtime": runtime(kind, {"probe.py": PROBE}),
        "agent": {"harness": "shell", "settings": {"command": command}},
        "evaluator": {"strategy": "test_on_output", "config": {"command": "test -f report.json"}},
        "callback_url": cluster.receiver.url,
    }
    reply = cluster.submit(task)
    assert reply.status_code == 201, reply.text
    [raw] = cluster.wait_task("escape", timeout_s=90)["results"]
    result = SessionResult.model_validate(raw)
    assert result.status == SessionStatus.COMPLETED, result.error
    report = json.loads((Path(str(result.session_dir)) / "workspace" / "report.json").read_text())

    assert report["own_call"] == 200
    refused = {name: report[name] for name in report if name not in ("own_call", "uid", "id_u")}
    for name in ("other_key_in_path", "other_key_in_bearer", "other_key_in_x_api_key"):
        assert refused.pop(name) == 403, name
    assert refused.pop("other_key_in_query") == 403
    for name in ("rollout_server", "submit_direct", "forged_result_direct", "node_direct"):
        assert str(refused.pop(name)).startswith("unreachable"), (name, report[name])
    assert refused.pop("shadow_readable") is False
    assert refused.pop("gshadow_readable") is False
    assert refused.pop("marker") is None
    assert all(status == 404 for status in refused.values()), refused
    assert report["uid"] == 65534 and report["id_u"] == "65534"

    # The own call is captured under the own session; nothing reached the victim or the gate.
    assert len(node.store.records(result.session_id)) == 1
    assert node.store.records(VICTIM) == []
    status = httpx.get(f"{node.url}/polar/status", headers=auth, timeout=10).json()
    assert status["paused"] is False
    listed = httpx.get(f"{node.url}/polar/node/sessions", headers=auth, timeout=10).json()
    assert [s["session_id"] for s in listed] == [result.session_id]
    tasks = httpx.get(f"{cluster.url}/tasks", headers=auth, timeout=10).json()
    assert [t["task_id"] for t in tasks] == ["escape"]
    assert not Path("/tmp/polar-escaped").exists()
