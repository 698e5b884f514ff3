"""Sessions per minute with 1 vs 2 gateway nodes on Ray, on the same tasks.

A real ``ray.cluster_utils.Cluster`` on 127.0.0.1 (head with ``polar_rollout``; N gateway
nodes with ``num_cpus=0`` + ``polar_gateway``), ``polar.ray.up``, then ``--sessions`` samples
of the tests' two-call shell task in bubblewrap against the scripted engine. Reports wall
time, sessions per minute, machine CPU seconds per session (from /proc/stat: every process,
so other load on the machine counts too), and the scheduler's share: time from submit until
every session is acknowledged by a node, and the sessions' median ``queued`` time.

    python bench/ray_nodes.py --nodes 1 2 --sessions 16
    python bench/ray_nodes.py --smoke        # 1 node, 2 sessions, 1 round (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))

import httpx  # noqa: E402
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import polar.ray  # noqa: E402
from integration.rollout_support.cluster import CallbackReceiver, free_port, shell_task  # noqa: E402


def busy_cpu_s() -> float:
    """Machine-wide non-idle CPU seconds so far (all cores)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run(nodes: int, sessions: int, rounds: int) -> dict[str, Any]:
    temp = tempfile.mkdtemp(prefix="polar-bench-", dir="/tmp")
    os.makedirs(f"{temp}/ray", exist_ok=True)
    os.environ["RAY_TMPDIR"] = temp
    os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    common = {
        "node_ip_address": "127.0.0.1",
        "include_dashboard": False,
        "object_store_memory": 80 * 1024**2,
        "temp_dir": temp,
    }
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "resources": {"polar_rollout": 1}, **common},
    )
    receiver = CallbackReceiver()
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=0, resources={"polar_gateway": 1}, **common)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="bench", log_to_driver=False)
        receiver.start()
        engine = "integration.rollout_support.ray_engine:conversation_engine"
        handle = polar.ray.up(
            {
                "ray": {
                    "address": cluster.address,
                    "gateways": {
                        "engine": {"kind": engine},
                        "served_model": "SmolLM2-135M-Instruct",
                        "workers": {"init": 4, "run": 8, "postrun": 4, "ready_buffer": 4},
                        "work_dir": f"{temp}/polar",
                    },
                },
                "rollout": {"port": free_port(), "data_dir": f"{temp}/rollout"},
            }
        )
        handle.wait_nodes(nodes, 120)
        out: list[dict[str, Any]] = []
        for index in range(rounds + 1):  # round 0 warms up (imports, first sandboxes)
            task_id = f"bench-{index}"
            cpu0, t0 = busy_cpu_s(), time.monotonic()
            task = shell_task(task_id, receiver, num_samples=sessions, timeout_s=120)
            httpx.post(f"{handle.rollout_url}/tasks", json=task, headers=handle.headers, timeout=10)
            acked = None
            while True:
                url = f"{handle.rollout_url}/tasks/{task_id}"
                body = httpx.get(url, headers=handle.headers, timeout=10).json()
                if acked is None:
                    views = httpx.get(f"{url}/sessions", headers=handle.headers, timeout=10).json()
                    if all(v["acknowledged"] for v in views):
                        acked = time.monotonic() - t0
                if body["status"] == "COMPLETED":
                    break
                time.sleep(0.05)
            wall, cpu = time.monotonic() - t0, busy_cpu_s() - cpu0
            results = body["results"]
            if index == 0:
                continue
            out.append(
                {
                    "wall_s": wall,
                    "sessions_per_min": 60 * sessions / wall,
                    "cpu_s_per_session": cpu / sessions,
                    "all_acknowledged_s": acked,
                    "queued_median_s": statistics.median(r["timing"]["queued"] for r in results),
                    "completed": sum(r["status"] == "COMPLETED" for r in results),
                    "per_node": sorted(
                        sum(1 for r in results if r["node_id"] == n)
                        for n in {r["node_id"] for r in results}
                    ),
                }
            )
        handle.down()
        return {"nodes": nodes, "sessions": sessions, "rounds": out}
    finally:
        receiver.stop()
        ray.shutdown()
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="1 node, 2 sessions, 1 round (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.nodes, args.sessions, args.rounds = [1], 2, 1
    for nodes in args.nodes:
        print(json.dumps(run(nodes, args.sessions, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
