"""1,000 sessions through the rollout server on one gateway node: pools, descriptors, dashboard.

Processes: the rollout server (``polar serve-rollout``), one gateway node (``polar
serve-gateway --topology ... --node n0``: the scripted engine in process, a run slot for every
session), and this one, which submits one task of ``--sessions`` samples and watches. Every
session runs the ``shell`` harness on the ``local`` runtime: a light harness, a POSIX ``sh``
loop that makes ``--calls`` chat completions with curl, each after a think time (uniform, mean
``--think`` seconds) standing for generation and tools, and fails on any reply but a 200.

Reported: wall time and outcomes; the node's stages over time (most sessions running at once);
the gateway process's own CPU per session and per call, and its harnesses' (reaped children,
from /proc), apart from the rollout server's; the gateway's peak RSS and descriptors, and the
most harness processes alive; the dashboard's overview and task pages (their live parts, as
the browser polls them), ``/status`` and the task summary timed while the sessions run; nothing
lost: model calls the harnesses had answered against records in the node's capture store, and
``polar capture verify``.

    python bench/rollout_scale.py                  # 1,000 sessions, 3 calls, 10 s think
    python bench/rollout_scale.py --smoke          # 4 sessions (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import process_fds, process_rss_kib
from gateway_overhead import free_port, process
from polar.serving import raise_descriptor_limit

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
TOKEN = "bench-rollout-scale-token"

# The light harness: think, call, check the status; ``--calls`` times. dash has no $RANDOM.
HARNESS = r"""
i=0
while [ $i -lt {calls} ]; do
  ms=$(( $(od -An -N2 -tu2 /dev/urandom) % {span_ms} ))
  sleep $((ms / 1000)).$(printf %03d $((ms % 1000)))
  code=$(curl -sS -o /dev/null -w '%{{http_code}}' --max-time 120 \
    -H "authorization: Bearer $OPENAI_API_KEY" -H 'content-type: application/json' \
    -d '{{"model":"polar","messages":[{{"role":"user","content":"call '$i'"}}]}}' \
    "$OPENAI_BASE_URL/chat/completions")
  [ "$code" = 200 ] || {{ echo "call $i: HTTP $code" >&2; exit 1; }}
  i=$((i + 1))
done
echo done
"""


def own_cpu_s(pid: int) -> tuple[float, float]:
    """(the process's own user+system CPU s, its reaped children's), from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def descendants(pid: int) -> int:
    count, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                children = [int(c) for c in (task / "children").read_text().split()]
                count += len(children)
                stack += children
        except OSError:
            continue
    return count


@dataclass
class Watch:
    """What the watcher saw while the task ran."""

    rss_kib: int = 0
    fds: int = 0
    harness_processes: int = 0
    running: int = 0  # most sessions in RUN at once (the node's own stage counts)
    timings_ms: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    events: dict[str, int] = field(default_factory=dict)  # what a dashboard's stream received

    def timed(self, name: str, ms: float) -> None:
        self.timings_ms.setdefault(name, []).append(ms)


def topology(args: argparse.Namespace, work: Path, rollout_port: int, node_port: int) -> Path:
    workers = {
        "init": args.init_workers,
        "run": args.sessions,
        "postrun": args.postrun_workers,
        "ready_buffer": args.init_workers * 2,
        "queue_limit": max(args.sessions, 256),
    }
    body = {
        "rollout": {
            "host": HOST,
            "port": rollout_port,
            "data_dir": str(work / "rollout"),
            "admin_token": TOKEN,
        },
        "nodes": [
            {
                "id": "n0",
                "host": HOST,
                "port": node_port,
                "engine": {"kind": "scripted"},
                "workers": workers,
                "work_dir": str(work / "node"),
                "admin_token": TOKEN,
            }
        ],
        "defaults": {"runtime": "local"},
    }
    path = work / "topology.yaml"
    path.write_text(json.dumps(body))  # JSON is YAML
    return path


def task(args: argparse.Namespace) -> dict[str, Any]:
    span_ms = max(1, int(2 * args.think * 1000))
    return {
        "task_id": "scale",
        "instruction": "Make some model calls.",
        "num_samples": args.sessions,
        "timeout_seconds": args.timeout,
        "runtime": {"kind": "local"},
        "agent": {
            "harness": "shell",
            "settings": {
                "command": HARNESS.format(calls=args.calls, span_ms=span_ms),
                "executable": "sh",
            },
        },
        "evaluator": {"strategy": "session_completed"},
    }


async def watch(
    client: httpx.AsyncClient, rollout: str, node_pid: int, seen: Watch, stop: asyncio.Event
) -> None:
    """Sample the node process each second; time the dashboard and status routes as a
    browser and a trainer would poll them."""
    routes = {
        "dashboard overview (live part)": "/dashboard/live",
        "dashboard task page (live part)": "/dashboard/tasks/scale/live",
        "GET /status": "/status",
        "GET /tasks/scale/summary": "/tasks/scale/summary",
    }
    while not stop.is_set():
        try:
            seen.rss_kib = max(seen.rss_kib, process_rss_kib(node_pid))
            seen.fds = max(seen.fds, process_fds(node_pid))
            seen.harness_processes = max(seen.harness_processes, descendants(node_pid))
        except OSError:
            return
        for name, route in routes.items():
            started = time.perf_counter()
            reply = await client.get(rollout + route)
            seen.timed(name, (time.perf_counter() - started) * 1000)
            if reply.status_code != 200:
                seen.errors.append(f"{route}: HTTP {reply.status_code}")
            elif route == "/status":
                for node in reply.json().get("nodes", []):
                    seen.running = max(seen.running, _running(node))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def follow_events(client: httpx.AsyncClient, rollout: str, seen: Watch) -> None:
    """The event stream a dashboard holds open, until the task completes."""
    url = f"{rollout}/events"
    since = {"last-event-id": "0"}  # from the first event, even if it came before we were in
    stream = client.stream("GET", url, params={"task_id": "scale"}, headers=since, timeout=None)
    async with stream as reply:
        async for line in reply.aiter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
                seen.events[kind] = seen.events.get(kind, 0) + 1
                if kind == "task_completed":
                    return


def _running(node: dict[str, Any]) -> int:
    stages = node.get("stages") or node.get("status", {}).get("stages") or {}
    return int(stages.get("running", stages.get("run", 0)) or 0)


async def drive(args: argparse.Namespace, rollout: str, node_pid: int, rollout_pid: int) -> dict:
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(headers=headers, timeout=60) as client:
        login = await client.get(f"{rollout}/dashboard/login", params={"token": TOKEN})
        if login.status_code >= 400:
            raise RuntimeError(f"dashboard login: HTTP {login.status_code}")
        deadline = time.monotonic() + 120
        while not [n for n in (await client.get(f"{rollout}/nodes")).json() if n["healthy"]]:
            if time.monotonic() > deadline:
                raise RuntimeError("the node did not register in 120 s")
            await asyncio.sleep(0.2)
        node_cpu0, rollout_cpu0 = own_cpu_s(node_pid), own_cpu_s(rollout_pid)
        seen, stop = Watch(), asyncio.Event()
        watcher = asyncio.create_task(watch(client, rollout, node_pid, seen, stop))
        events = asyncio.create_task(follow_events(client, rollout, seen))
        began = time.monotonic()
        reply = await client.post(f"{rollout}/tasks", json=task(args))
        if reply.status_code != 201:
            raise RuntimeError(f"submit: HTTP {reply.status_code}: {reply.text[:500]}")
        while True:
            summary = (await client.get(f"{rollout}/tasks/scale/summary")).json()
            if summary["status"] == "COMPLETED":
                break
            if time.monotonic() - began > args.timeout + 300:
                raise RuntimeError(f"the task did not complete: {summary}")
            await asyncio.sleep(0.5)
        wall = time.monotonic() - began
        stop.set()
        await watcher
        await asyncio.wait_for(events, 30)
        node_cpu, rollout_cpu = own_cpu_s(node_pid), own_cpu_s(rollout_pid)
        started = time.perf_counter()
        result = (await client.get(f"{rollout}/tasks/scale")).json()
        seen.timed("GET /tasks/scale (all results)", (time.perf_counter() - started) * 1000)
    return {
        "wall_s": wall,
        "results": result["results"],
        "watch": seen,
        "gateway_cpu_s": node_cpu[0] - node_cpu0[0],
        "harness_cpu_s": node_cpu[1] - node_cpu0[1],
        "rollout_cpu_s": rollout_cpu[0] - rollout_cpu0[0],
    }


def report(args: argparse.Namespace, run: dict[str, Any], fresh_kib: int, verify: dict) -> str:
    results, seen = run["results"], run["watch"]
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    completed = statuses.get("COMPLETED", 0)
    answered = completed * args.calls  # a session completes only after every call got a 200
    records = sum(s["records"] for s in verify.get("sessions", []))
    faults = len(verify.get("integrity", [])) + sum(
        len(s["faults"]) for s in verify.get("sessions", [])
    )
    calls = max(records, 1)
    failures = sorted({(r.get("failure") or {}).get("reason", "") for r in results} - {""})
    lines = [
        f"Machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end; "
        f"{args.sessions} sessions x {args.calls} calls, think mean {args.think:g} s, "
        f"run slots {args.sessions}, init {args.init_workers}, postrun {args.postrun_workers}.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| wall (submit to task COMPLETED) | {run['wall_s']:.1f} s |",
        f"| outcomes | {', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))} |",
        f"| failure reasons | {', '.join(failures) or 'none'} |",
        f"| most sessions running at once (node stages) | {seen.running} |",
        f"| most harness processes alive | {seen.harness_processes} |",
        f"| gateway process CPU | {run['gateway_cpu_s']:.1f} s: "
        f"{1000 * run['gateway_cpu_s'] / max(len(results), 1):.1f} ms/session, "
        f"{1000 * run['gateway_cpu_s'] / calls:.1f} ms/call |",
        f"| harness processes' CPU (sh, sleep, curl) | {run['harness_cpu_s']:.1f} s |",
        f"| rollout server CPU | {run['rollout_cpu_s']:.1f} s |",
        f"| gateway RSS fresh -> peak | {fresh_kib / 1024:.0f} -> {seen.rss_kib / 1024:.0f} MiB "
        f"({(seen.rss_kib - fresh_kib) / max(args.sessions, 1):.0f} KiB per session) |",
        f"| gateway descriptors (peak) | {seen.fds} |",
        f"| nothing lost | {answered} calls answered to completed sessions, {records} records "
        f"in the node's store, verify {faults} faults |",
    ]
    for name, times in seen.timings_ms.items():
        lines.append(
            f"| {name} | p50 {statistics.median(times):.0f} ms, max {max(times):.0f} ms "
            f"({len(times)} reads) |"
        )
    shown = ", ".join(f"{k} {v}" for k, v in sorted(seen.events.items()))
    lines.append(f"| events a dashboard's stream received | {shown} |")
    if seen.errors:
        lines.append(f"| route errors | {len(seen.errors)}, first: {seen.errors[0]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--calls", type=int, default=3, help="model calls per session")
    p.add_argument("--think", type=float, default=10.0, help="mean think time before a call (s)")
    p.add_argument("--init-workers", type=int, default=16)
    p.add_argument("--postrun-workers", type=int, default=8)
    p.add_argument("--timeout", type=float, default=600.0, help="each session's budget (s)")
    p.add_argument("--keep", action="store_true", help="keep the work dir")
    p.add_argument("--log-level", default="warning", help="the servers' (logs in the work dir)")
    p.add_argument("--smoke", action="store_true", help="4 sessions, 2 calls, short thinks (CI)")
    args = p.parse_args(argv)
    if args.smoke:
        args.sessions, args.calls, args.think, args.init_workers = 4, 2, 0.05, 2
    nofile = raise_descriptor_limit()
    work = Path(tempfile.mkdtemp(prefix="polar-rollout-scale-"))
    env = os.environ | {"PYTHONPATH": str(ROOT / "src"), "POLAR_LOG_LEVEL": args.log_level}
    rollout_port, node_port = free_port(), free_port()
    topo = topology(args, work, rollout_port, node_port)
    polar = [sys.executable, "-m", "polar.cli.main"]
    try:
        with (
            process("rollout", [*polar, "serve-rollout", "--config", str(topo)], rollout_port,
                    env, work) as rollout_pid,
            process("node", [*polar, "serve-gateway", "--topology", str(topo), "--node", "n0"],
                    node_port, env, work) as node_pid,
        ):  # fmt: skip
            time.sleep(1.0)
            fresh_kib = process_rss_kib(node_pid)
            rollout = f"http://{HOST}:{rollout_port}"
            run = asyncio.run(drive(args, rollout, node_pid, rollout_pid))
        db = work / "node" / "captures.db"
        verify_argv = [*polar, "capture", "verify", "--json", str(db)]
        done = subprocess.run(verify_argv, env=env, capture_output=True, text=True, check=False)
        verify = json.loads(done.stdout) if done.stdout.strip() else {"error": done.stderr}
        print(f"Descriptor limit (soft, raised to the hard one): {nofile}.")
        print(report(args, run, fresh_kib, verify))
    finally:
        if args.keep:
            print(f"work dir kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
