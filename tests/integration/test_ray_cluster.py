"""Polar on a real multi-node Ray cluster on 127.0.0.1 (``ray.cluster_utils.Cluster``): a head
(the rollout resource, and one CPU for a "trainer"), two gateway nodes started the way
docs/scale-out.md says (``num_cpus=0`` plus ``polar_gateway``). The tests share one cluster
and one ``polar.ray.up`` and run in file order: placement, end to end with exact tokens per
node, a harness's descriptors, a gateway crash, a gateway past its restart budget, a rollout
server crash, node loss, node join, drain with a deadline, status (drained is not dead), then
coexistence with the trainer's actor and ``down``; last, with Polar down, ``polar ray up``
processes ended by SIGHUP, SIGTERM, a SIGINT from a script's background and a ``--wait-nodes``
deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest.mock import patch

import httpx
import pytest
import yaml

from integration.rollout_support.cluster import CallbackReceiver, free_port, shell_task
from integration.test_inherited_descriptors import PROBE
from polar.capture.store import CaptureStore
from polar.ray import down as polar_down
from polar.schemas.task import SessionResult, SessionStatus
from polar.tokens import GATEWAY_TOKEN_FILE

# Read when Ray is imported: without it the driver rewrites 127.0.0.1 to the host's address and
# hangs on a GCS that listens on loopback only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ray = pytest.importorskip("ray", reason="ray not installed (pip install 'polar[ray]')")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) not installed"),
]

TESTS_DIR = Path(__file__).resolve().parents[1]
GRACE_S = 60.0  # node loss must be reported long before this
GATEWAY_NODE: dict[str, Any] = {"num_cpus": 0, "resources": {"polar_gateway": 1}}
MAX_RESTARTS = 1  # the crash test spends it; the restart-budget test then exhausts it


@dataclass
class Env:
    cluster: Any
    polar: Any
    receiver: CallbackReceiver
    work_dir: Path
    common: dict[str, Any]
    config: dict[str, Any]

    @property
    def url(self) -> str:
        return str(self.polar.rollout_url)

    def submit(self, task: dict[str, Any]) -> None:
        reply = httpx.post(f"{self.url}/tasks", json=task, headers=self.polar.headers, timeout=10)
        assert reply.status_code == 201, reply.text

    def task(self, task_id: str) -> dict[str, Any]:
        reply = httpx.get(f"{self.url}/tasks/{task_id}", headers=self.polar.headers, timeout=10)
        reply.raise_for_status()
        return dict(reply.json())

    def sessions(self, task_id: str) -> list[dict[str, Any]]:
        url = f"{self.url}/tasks/{task_id}/sessions"
        return list(httpx.get(url, headers=self.polar.headers, timeout=10).json())

    def wait_task(self, task_id: str, timeout_s: float = 60.0) -> list[SessionResult]:
        body = wait(lambda: self._done(task_id), timeout_s, f"task {task_id} completes")
        return [SessionResult.model_validate(r) for r in body["results"]]

    def _done(self, task_id: str) -> dict[str, Any] | None:
        try:
            body = self.task(task_id)
        except httpx.HTTPError:
            return None  # the server is restarting
        return body if body["status"] == "COMPLETED" else None

    def gateways(self) -> dict[str, dict[str, Any]]:
        """Polar's gateway actors by Polar node id: where each runs."""
        out = {}
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry["namespace"] == "polar" and entry["name"].startswith("polar-gw-"):
                try:
                    actor = ray.get_actor(entry["name"], namespace="polar")
                    where = ray.get(actor.where.remote(), timeout=20)
                except (ValueError, ray.exceptions.RayError):
                    continue
                out[where["node_id"]] = where
        return out

    def healthy(self) -> set[str]:
        return {n.node_id for n in self.polar.nodes() if n.healthy}

    def capture_store(self, node_id: str) -> CaptureStore:
        return CaptureStore(self.work_dir / node_id / "captures.db")


def wait(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s:g}s: {what}")


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    from ray.cluster_utils import Cluster

    import polar.ray

    temp = tempfile.mkdtemp(prefix="polar-ray-", dir="/tmp")  # short: Ray's sockets live here
    common = {
        "node_ip_address": "127.0.0.1",
        "include_dashboard": False,
        "object_store_memory": 80 * 1024**2,
        "temp_dir": temp,
    }
    system = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # for worker processes too
        patch.setenv("RAY_USAGE_STATS_ENABLED", "0")
        patch.delenv("RAY_ADDRESS", raising=False)
        # Ray notes "the current cluster" under RAY_TMPDIR: ours, not a shared /tmp/ray.
        patch.setenv("RAY_TMPDIR", temp)
        os.makedirs(os.path.join(temp, "ray"), exist_ok=True)
        # Worker processes import the test engine from tests/.
        path = os.environ.get("PYTHONPATH", "")
        patch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(TESTS_DIR), path) if p))
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "resources": {"polar_rollout": 1},
                "_system_config": system,
                **common,
            },
        )
        receiver = CallbackReceiver()
        try:
            for _ in range(2):
                cluster.add_node(**GATEWAY_NODE, **common)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, namespace="trainer", log_to_driver=False)
            receiver.start()
            work_dir = Path(temp) / "polar"
            config = {
                "ray": {
                    "address": cluster.address,
                    "reconcile_s": 0.3,
                    "gateways": {
                        "engine": {
                            "kind": "integration.rollout_support.ray_engine:conversation_engine"
                        },
                        "served_model": "SmolLM2-135M-Instruct",
                        "workers": {"init": 2, "run": 4, "postrun": 2, "ready_buffer": 2},
                        "work_dir": str(work_dir),
                        "heartbeat_s": 0.3,
                        "max_restarts": MAX_RESTARTS,
                    },
                },
                "rollout": {
                    "port": free_port(),  # fixed: a restarted server keeps its URL
                    "data_dir": str(Path(temp) / "rollout"),
                    "heartbeat_timeout_s": 2.0,
                    "node_grace_s": GRACE_S,
                    "dispatch_interval_s": 0.02,
                    "dispatch_retry": {"initial_s": 0.05, "max_s": 0.5, "timeout_s": 5},
                    "callback_retry": {"initial_s": 0.05, "max_s": 0.3, "deadline_s": 120},
                },
            }
            polar_ray = polar.ray.up(config)
            yield Env(cluster, polar_ray, receiver, work_dir, common, config)
        finally:
            receiver.stop()
            ray.shutdown()
            cluster.shutdown()  # only this cluster's processes; never `ray stop`
            shutil.rmtree(temp, ignore_errors=True)


def ray_node_of(env: Env, node_id: str) -> Any:
    where = env.gateways()[node_id]
    return next(n for n in env.cluster.worker_nodes if n.node_id == where["ray_node_id"])


def test_up_without_an_address_fails_with_a_message() -> None:
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    run = subprocess.run(
        [sys.executable, "-m", "polar.cli.main", "ray", "up"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
    )
    assert run.returncode == 2
    assert "no Ray cluster to join" in run.stderr and "never starts a Ray cluster" in run.stderr


def test_placement_one_gateway_per_gateway_node_none_on_the_head(env: Env) -> None:
    healthy = wait(lambda: len(env.healthy()) == 2 and env.healthy(), 60, "two gateways up")
    gateways = env.gateways()
    assert set(gateways) == healthy
    head = env.cluster.head_node.node_id
    workers = {n.node_id for n in env.cluster.worker_nodes}
    assert {g["ray_node_id"] for g in gateways.values()} == workers  # one on each, not the head
    for node_id, where in gateways.items():
        assert node_id == f"ray-{where['ray_node_id'][:12]}"
    rollout = ray.get(env.polar.actor.where.remote())
    assert rollout["ray_node_id"] == head
    for view in env.polar.nodes():
        assert view.url is not None and not view.url.endswith(":0")  # the real bound port
        assert httpx.get(f"{view.url}/health", timeout=5).status_code == 200


def test_end_to_end_exact_tokens_on_each_node(env: Env) -> None:
    # Both gateways up first, whatever ran before: run alone, the first gateway took all 8.
    wait(lambda: len(env.healthy()) == 2 and env.healthy(), 60, "two gateways up")
    env.submit(shell_task("e2e", env.receiver, num_samples=8, timeout_s=60))
    results = env.wait_task("e2e", 90)
    assert len(results) == 8 and len({r.node_id for r in results}) == 2
    for r in results:
        assert r.status == SessionStatus.COMPLETED and r.reward == 1.0, r.error
        assert r.trajectory is not None and r.node_id is not None
        [trace] = r.trajectory.traces
        records = env.capture_store(r.node_id).records(r.session_id)
        assert len(records) == 2
        sampled = [t for rec in records for t in rec.sampled_ids]
        trainable = [t for t, m in zip(trace.response_ids, trace.loss_mask, strict=True) if m]
        assert trainable == sampled  # exactly the engine's tokens, on the node that ran it


def test_a_harness_on_a_ray_node_sees_only_its_stdio(env: Env) -> None:
    """Issue 28 on Ray: a Ray worker holds ~20 log files and sockets (the gateway actor's own
    process, checked below); a harness in bubblewrap under that gateway lists /proc/self/fd and
    must find 0, 1 and 2 alone (before the fix: Ray's log descriptors, written to from inside)."""
    probe = {"kind": "bubblewrap", "files": {"probe.py": PROBE}}
    listing = {"strategy": "test_on_output", "config": {"command": "test -f fds.json"}}
    task = shell_task("fds", env.receiver, num_samples=4, runtime=probe, evaluator=listing)
    task["agent"]["settings"]["command"] = "python3 probe.py"
    env.submit(task)
    results = env.wait_task("fds", 90)
    gateways = env.gateways()
    assert len(results) == 4
    for r in results:
        assert r.status == SessionStatus.COMPLETED, r.error
        assert r.node_id in gateways and r.session_dir is not None
        held = os.listdir(f"/proc/{gateways[r.node_id]['pid']}/fd")
        assert len(held) > 3, held  # the Ray worker has descriptors a harness could inherit
        seen = json.loads((Path(r.session_dir) / "workspace" / "fds.json").read_text())
        assert seen == [0, 1, 2], f"{r.node_id}: harness holds {seen}"


def hang_on_first_gateway(env: Env, task_id: str) -> tuple[str, dict[str, Any], set[str]]:
    """A task of 4 hanging sessions, dispatched; the first gateway (by node id), where it runs
    and the sessions it holds."""
    hang = {"AGENT_MODE": "hang"}
    env.submit(shell_task(task_id, env.receiver, num_samples=4, timeout_s=20, agent_env=hang))
    wait(lambda: all(s["acknowledged"] for s in env.sessions(task_id)), 30, "dispatched")
    victim, where = sorted(env.gateways().items())[0]
    held = {s["session_id"] for s in env.sessions(task_id) if s["node_id"] == victim}
    assert held
    return victim, where, held


def test_a_crashed_gateway_restarts_on_its_own_node(env: Env) -> None:
    victim, before, held = hang_on_first_gateway(env, "crash")
    os.kill(before["pid"], signal.SIGKILL)

    after = _next_life(env, victim, before["pid"])
    assert after["ray_node_id"] == before["ray_node_id"] and after["restarted"]
    lost = wait(
        lambda: [s for s in env.sessions("crash") if s["session_id"] in held and s["error"]],
        30,
        "its sessions failed",
    )
    assert all("restarted and lost it" in s["error"] for s in lost)
    # The restarted node refuses a session id it ran in its earlier life (never run twice).
    token = (env.work_dir / victim / GATEWAY_TOKEN_FILE).read_text().strip()
    task = shell_task("crash", env.receiver, num_samples=1)
    replay = httpx.post(
        f"{after['url']}/polar/node/sessions",
        json={"session_id": next(iter(held)), "sample_index": 0, "task": task},
        headers={"authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert replay.status_code == 409, replay.text
    results = env.wait_task("crash", 60)
    failed = [r for r in results if r.session_id in held]
    assert all(r.failure is not None and r.failure.kind == "infra" for r in failed)
    wait(lambda: victim in env.healthy(), 30, "the restarted gateway is healthy")


def test_a_gateway_past_its_restart_budget_is_lost_at_once_and_replaced(env: Env) -> None:
    """Ray lets a gateway die for good after max_restarts while its node lives: its sessions
    fail at once as node_lost (not node_dead after the grace) and a fresh gateway takes the
    node (before: the node had no gateway for good)."""
    victim, where, held = hang_on_first_gateway(env, "spent")
    for _ in range(MAX_RESTARTS + 1):  # the crash test may have spent some already
        killed = time.monotonic()
        os.kill(where["pid"], signal.SIGKILL)
        where = _next_life(env, victim, where["pid"])
        if not where["restarted"]:
            break  # a new actor, not a restart: the budget was spent
    assert not where["restarted"], "never replaced"
    assert where["ray_node_id"] == ray_node_of(env, victim).node_id

    def failed() -> list[dict[str, Any]]:
        done = [s for s in env.sessions("spent") if s["session_id"] in held and s["error"]]
        return done if len(done) == len(held) else []

    lost = wait(failed, 30, "its sessions failed")
    assert time.monotonic() - killed < GRACE_S / 3  # reported, not the grace period
    assert all(f"node {victim} lost" in s["error"] and "restarts" in s["error"] for s in lost)
    wait(lambda: victim in env.healthy(), 30, "the replacement registered")
    results = env.wait_task("spent", 60)
    for r in results:
        if r.session_id in held:
            assert r.failure is not None and (r.failure.kind, r.failure.reason) == (
                "infra",
                "node_lost",
            )


def _next_life(env: Env, node_id: str, pid: int) -> dict[str, Any]:
    """The gateway of ``node_id`` once a process other than ``pid`` runs it."""
    return dict(
        wait(
            lambda: (g := env.gateways().get(node_id)) and g["pid"] != pid and g,
            60,
            "the gateway restarted or was replaced",
        )
    )


def test_a_crashed_rollout_server_restarts_and_each_callback_arrives_once(env: Env) -> None:
    slow = {"strategy": "test_on_output", "config": {"command": "sleep 4; test -f hello.txt"}}
    env.submit(shell_task("restart", env.receiver, num_samples=4, timeout_s=60, evaluator=slow))
    wait(lambda: all(s["acknowledged"] for s in env.sessions("restart")), 30, "dispatched")
    sessions = {s["session_id"] for s in env.sessions("restart")}
    before = ray.get(env.polar.actor.where.remote())
    os.kill(before["pid"], signal.SIGKILL)  # while every session is still evaluating

    results = env.wait_task("restart", 90)
    after = ray.get(env.polar.actor.where.remote())
    assert after["pid"] != before["pid"] and after["ray_node_id"] == before["ray_node_id"]
    assert after["url"] == before["url"] and after["restarted"]
    assert {r.session_id for r in results} == sessions
    assert all(r.status == SessionStatus.COMPLETED for r in results)
    assert env.task("e2e")["status"] == "COMPLETED"  # finished before the crash: still there
    time.sleep(1.0)  # a duplicate would arrive now
    keys = [c["key"] for c in env.receiver.received if c["body"]["task_id"] == "restart"]
    assert sorted(keys) == sorted(sessions)


def test_node_loss_fails_its_sessions_at_once_as_infra(env: Env) -> None:
    hang = {"AGENT_MODE": "hang"}
    env.submit(shell_task("loss", env.receiver, num_samples=4, timeout_s=15, agent_env=hang))
    wait(lambda: all(s["status"] == "RUNNING" for s in env.sessions("loss")), 30, "running")
    victim = sorted(env.gateways())[0]
    ray_node = ray_node_of(env, victim)
    on_victim = {s["session_id"] for s in env.sessions("loss") if s["node_id"] == victim}
    assert on_victim
    session_dir = str(env.work_dir / victim / "sessions")
    killed = time.monotonic()
    env.cluster.remove_node(ray_node, allow_graceful=False)

    def failed() -> list[dict[str, Any]]:
        done = [s for s in env.sessions("loss") if s["session_id"] in on_victim and s["error"]]
        return done if len(done) == len(on_victim) else []

    lost = wait(failed, 30, "the lost node's sessions fail")
    assert time.monotonic() - killed < GRACE_S / 3  # Ray's report, not the grace period
    assert all(f"node {victim} lost" in s["error"] for s in lost)
    others = [s for s in env.sessions("loss") if s["session_id"] not in on_victim]
    assert all(not s["error"] for s in others)  # the other node goes on
    results = env.wait_task("loss", 60)
    for r in results:
        if r.session_id in on_victim:
            assert r.failure is not None and (r.failure.kind, r.failure.reason) == (
                "infra",
                "node_lost",
            )
        else:
            assert r.status == SessionStatus.TIMEOUT  # the hanging agent ran out of time
    wait(lambda: not _processes_under(session_dir), 15, "no sandbox of the dead node survives")


def test_a_joining_node_gets_a_gateway_and_work(env: Env) -> None:
    before = set(env.gateways())
    env.cluster.add_node(**GATEWAY_NODE, **env.common)
    joined = wait(lambda: set(env.gateways()) - before, 60, "a gateway on the new node")
    [new] = joined
    wait(lambda: new in env.healthy(), 30, "the new gateway registered")
    env.submit(shell_task("join", env.receiver, num_samples=6, timeout_s=60))
    results = env.wait_task("join", 90)
    assert all(r.status == SessionStatus.COMPLETED for r in results)
    assert new in {r.node_id for r in results}


def test_drain_with_a_deadline_cancels_what_is_left_and_retires_the_gateway(env: Env) -> None:
    hang = {"AGENT_MODE": "hang"}
    env.submit(shell_task("drain", env.receiver, num_samples=4, timeout_s=30, agent_env=hang))
    wait(lambda: all(s["status"] == "RUNNING" for s in env.sessions("drain")), 30, "running")
    nodes = sorted({s["node_id"] for s in env.sessions("drain")})
    assert len(nodes) == 2
    victim = nodes[0]
    on_victim = {s["session_id"] for s in env.sessions("drain") if s["node_id"] == victim}
    cli = subprocess.run(
        [sys.executable, "-m", "polar.cli.main", "ray", "drain", victim, "--deadline", "2"],
        capture_output=True,
        text=True,
        env={**os.environ, "RAY_ADDRESS": env.cluster.address},
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    assert f"node {victim} draining" in cli.stdout

    def cancelled() -> list[dict[str, Any]]:
        done = [s for s in env.sessions("drain") if s["session_id"] in on_victim and s["error"]]
        return done if len(done) == len(on_victim) else []

    failed = wait(cancelled, 20, "the drained node's sessions end at the deadline")
    assert all("deadline" in s["error"] for s in failed)
    assert all(not s["error"] for s in env.sessions("drain") if s["session_id"] not in on_victim)
    wait(lambda: victim not in env.gateways(), 20, "the drained gateway stops")
    time.sleep(2.0)  # several reconcile rounds: it must not come back
    assert victim not in env.gateways()
    results = env.wait_task("drain", 60)
    for r in results:
        if r.session_id in on_victim:
            assert r.failure is not None and r.failure.reason == "drain_deadline"


def test_status_shows_a_drained_node_as_drained_and_a_lost_one_as_dead(env: Env) -> None:
    cli = subprocess.run(
        [sys.executable, "-m", "polar.cli.main", "ray", "status"],
        capture_output=True,
        text=True,
        env={**os.environ, "RAY_ADDRESS": env.cluster.address},
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    states = {line.split()[0]: line.split()[1] for line in cli.stdout.splitlines()[1:]}
    views = {v.node_id: v for v in env.polar.nodes()}
    drained = {n for n, v in views.items() if v.drained}
    dead = {n for n, v in views.items() if v.dead}
    assert len(drained) == 1 and len(dead) == 1  # the drain test's node, the node-loss test's
    assert {states[n] for n in drained} == {"drained"} and {states[n] for n in dead} == {"dead"}
    assert list(states.values()).count("healthy") == 1  # 2 joined + 1, 1 lost, 1 drained


def test_a_trainer_in_its_own_namespace_is_left_alone(env: Env) -> None:
    @ray.remote(num_cpus=1)
    class Trainer:
        def node(self) -> str:
            return str(ray.get_runtime_context().get_node_id())

    trainer = Trainer.options(name="trainer", namespace="trainer", lifetime="detached").remote()
    # Gateway nodes have no CPU for Ray: the trainer's CPU actor can only go to the head.
    assert ray.get(trainer.node.remote(), timeout=60) == env.cluster.head_node.node_id
    assert env.cluster.head_node.node_id not in {g["ray_node_id"] for g in env.gateways().values()}

    killed = env.polar.down()
    assert "polar-rollout" in killed and all(n.startswith("polar-") for n in killed)
    wait(lambda: not env.gateways(), 30, "Polar's actors are gone")
    assert ray.get(trainer.node.remote(), timeout=30)  # still alive
    names = {(e["namespace"], e["name"]) for e in ray.util.list_named_actors(all_namespaces=True)}
    assert ("trainer", "trainer") in names
    assert not any(ns == "polar" for ns, _ in names)
    ray.kill(trainer)


def test_down_also_kills_a_gateway_that_comes_up_while_it_runs(env: Env) -> None:
    """A gateway the rollout server was creating when `down` listed the actors registers after
    the listing (a CI dry run saw one outlive `polar ray up`'s teardown). `down` lists again
    until none is left, so that one is killed too, and nothing is left when `down` returns."""
    namespace = "late-gateway"

    @ray.remote(num_cpus=0)
    class Stub:
        def ping(self) -> bool:
            return True

    def start(name: str) -> None:
        actor = Stub.options(name=name, namespace=namespace, lifetime="detached").remote()
        assert ray.get(actor.ping.remote(), timeout=60)

    start("polar-rollout")
    start("polar-gw-early")
    real_kill = ray.kill
    late: list[str] = []

    def kill_then_a_late_gateway(actor: Any, **kwargs: Any) -> None:
        real_kill(actor, **kwargs)
        if not late:  # the rollout server's creation in flight lands after the listing
            late.append("polar-gw-late")
            start("polar-gw-late")

    try:
        with patch.object(ray, "kill", kill_then_a_late_gateway):
            killed = polar_down(namespace)
        assert killed[0] == "polar-rollout"
        assert set(killed) == {"polar-rollout", "polar-gw-early", "polar-gw-late"}, killed
        assert not _actors_in(namespace)
    finally:
        polar_down(namespace)


def _up_file(env: Env, tmp: Path, namespace: str) -> Path:
    """A `polar ray up` file like the module's, with its own namespace, port and dirs."""
    config = deepcopy(env.config)
    config["ray"]["namespace"] = namespace
    config["ray"]["gateways"]["work_dir"] = str(tmp / "gateways")
    config["rollout"].update(port=free_port(), data_dir=str(tmp / "rollout"))
    path = tmp / "polar-ray.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _actors_in(namespace: str) -> list[str]:
    return [
        e["name"]
        for e in ray.util.list_named_actors(all_namespaces=True)
        if e["namespace"] == namespace
    ]


def _torn_down(namespace: str) -> None:
    try:
        wait(lambda: not _actors_in(namespace), 30, f"no Polar actor left in {namespace}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {_actors_in(namespace)} still up") from None
    finally:
        polar_down(namespace)  # whatever the test found, leave nothing to later tests


UP = [sys.executable, "-m", "polar.cli.main", "ray", "up"]
STOPS = [
    pytest.param("SIGHUP", "ready", False, id="sighup-terminal-closed"),
    pytest.param("SIGTERM", "waiting", False, id="sigterm-while-waiting-for-nodes"),
    pytest.param("SIGINT", "ready", True, id="sigint-in-a-scripts-background"),
]


@pytest.mark.parametrize(("name", "when", "background"), STOPS)
def test_a_foreground_up_ended_by_a_signal_takes_its_gateways_down(
    env: Env, tmp_path: Path, name: str, when: str, background: bool
) -> None:
    """Gateways are detached actors: only `polar ray up`'s own teardown removes them. Before:
    SIGHUP killed it outright, SIGTERM before 'ready' hit Ray's handler (exit, no teardown),
    and a background child of a non-interactive shell ignored SIGINT."""
    assert not env.gateways(), "Polar is down (the previous test)"
    namespace = f"sig-{name.lower()}"
    config = _up_file(env, tmp_path, namespace)
    wait_nodes = "2" if when == "ready" else "3"  # 3: never reached, it is still waiting
    command = [*UP, "--config", str(config), "--wait-nodes", wait_nodes, "--wait-timeout", "0"]
    pid_file = tmp_path / "pid"
    if background:  # as a CI script starts it: `polar ray up ... &` (SIGINT arrives ignored)
        line = " ".join(f"'{part}'" for part in command)
        command = ["bash", "-c", f"{line} & echo $! > {pid_file}; wait $!"]
    up = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ
    )
    try:
        assert up.stdout is not None
        seen = []
        for out in up.stdout:
            seen.append(out)
            if (when == "ready" and out.startswith("ready:")) or (
                when == "waiting" and out.startswith("Polar rollout server on Ray")
            ):
                break
        else:
            raise AssertionError("".join(seen))
        wait(lambda: any(n.startswith("polar-gw-") for n in _actors_in(namespace)), 60, "gw")
        pid = int(pid_file.read_text()) if background else up.pid
        before = _actors_in(namespace)
        assert "polar-rollout" in before  # its handle is held: Ray would collect it otherwise
        os.kill(pid, getattr(signal, name))
        rest, _ = up.communicate(timeout=60)
        assert up.returncode == 0, "".join(seen) + rest
        assert "took Polar down: polar-rollout, polar-gw-" in rest, rest
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        _torn_down(namespace)


def test_wait_nodes_gives_up_at_its_deadline_and_takes_polar_down(env: Env, tmp_path: Path) -> None:
    config = _up_file(env, tmp_path, "deadline")  # two gateway nodes are left: 3 never come
    started = time.monotonic()
    up = subprocess.run(
        [*UP, "--config", str(config), "--wait-nodes", "3", "--wait-timeout", "8"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    try:
        assert up.returncode == 2, up.stdout + up.stderr
        assert "of 3 gateways up after 8s" in up.stderr
        assert "took Polar down: polar-rollout" in up.stdout
        assert time.monotonic() - started < 120
    finally:
        _torn_down("deadline")


def _processes_under(path: str) -> list[int]:
    """Processes whose command line names ``path`` (a dead node's sandboxes would)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if path in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
