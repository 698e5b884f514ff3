"""Benchmark the gateway node's session pools and the rollout server's scheduler.

1. Run-slot utilisation. The real :class:`~polar.gateway.node.lifecycle.Lifecycle` drives sessions
   whose runtime start costs ``--start`` seconds and whose harness makes ``--calls`` model calls
   to a fake engine of ``--latency`` seconds each. With a READY buffer, INIT overlaps the runs;
   with ``ready_buffer: 0`` each run slot first starts its own runtime (INIT inline on the run
   path). Utilisation is the time run slots spend running harnesses over ``run_workers`` x the
   makespan (overall, and in the steady state between the first run's start and the last run's
   end). Sessions per minute is sessions / makespan.
2. Scheduler overhead. 1,000 sessions queued on the real RolloutService (SQLite store, real
   scheduler) over 8 nodes that acknowledge at once (an in-process transport): the time from
   submit until every session is acknowledged, per session; and the pure node choice alone.

    python bench/rollout.py             # ~1 min
    python bench/rollout.py --quick     # fewer sessions
    python bench/rollout.py --smoke     # 16 sessions: seconds (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from polar.delivery import RetryPolicy
from polar.gateway.config import NodeConfig
from polar.gateway.node.lifecycle import Lifecycle, NodeSession, RunOutcome
from polar.rollout.config import RolloutServerConfig
from polar.rollout.scheduler import NodeLoad, choose_node
from polar.rollout.service import RolloutService
from polar.schemas.node import (
    NodeReport,
    NodeSessionInfo,
    NodeStatus,
    SessionDispatch,
    Workers,
)
from polar.schemas.task import SessionResult, SessionStatus, TaskRequest


@dataclass
class Meter:
    """Run intervals of every session, to compute slot utilisation."""

    runs: list[tuple[float, float]] = field(default_factory=list)
    engine_calls: int = 0


class FakeEngine:
    """Fixed latency per call; unlimited concurrency (the GPU batches)."""

    def __init__(self, latency_s: float, meter: Meter) -> None:
        self.latency_s = latency_s
        self.meter = meter

    async def complete(self) -> None:
        await asyncio.sleep(self.latency_s)
        self.meter.engine_calls += 1


class BenchWork:
    """A fake runtime (start costs ``start_s``) and a fake harness (``calls`` engine calls)."""

    def __init__(
        self, session: NodeSession, start_s: float, calls: int, engine: FakeEngine, meter: Meter
    ) -> None:
        self.session = session
        self.start_s = start_s
        self.calls = calls
        self.engine = engine
        self.meter = meter

    async def init(self) -> None:
        await asyncio.sleep(self.start_s)

    async def run(self, budget_s: float) -> None:
        began = time.perf_counter()
        for _ in range(self.calls):
            await self.engine.complete()
        self.meter.runs.append((began, time.perf_counter()))

    async def postrun(self, outcome: RunOutcome) -> SessionResult:
        return SessionResult(
            session_id=self.session.session_id,
            task_id=self.session.task_id,
            status=outcome.status,
        )

    async def abort(self) -> None:
        return None


async def pools(
    sessions: int,
    run_workers: int,
    ready_buffer: int,
    init_workers: int,
    start_s: float,
    calls: int,
    latency_s: float,
) -> dict[str, Any]:
    meter = Meter()
    engine = FakeEngine(latency_s, meter)
    config = NodeConfig(
        node_id="bench",
        init_workers=init_workers,
        run_workers=run_workers,
        postrun_workers=2,
        ready_buffer=ready_buffer,
        queue_limit=max(sessions, 1),
        keep_finished=sessions,
    )
    life = Lifecycle(config, lambda s: BenchWork(s, start_s, calls, engine, meter))
    life.start()
    task = TaskRequest(task_id="bench", instruction="x", timeout_seconds=3600)
    began = time.perf_counter()
    for i in range(sessions):
        await life.dispatch(SessionDispatch(session_id=f"bench-session-{i:06d}", task=task))
    for i in range(sessions):
        await life.wait(f"bench-session-{i:06d}")
    makespan = time.perf_counter() - began
    await life.stop()
    busy = sum(end - start for start, end in meter.runs)
    first = min(start for start, _ in meter.runs)
    last = max(end for _, end in meter.runs)
    return {
        "mode": f"READY buffer {ready_buffer}" if ready_buffer else "INIT inline",
        "sessions": sessions,
        "run_workers": run_workers,
        "init_workers": init_workers if ready_buffer else 0,
        "start_s": start_s,
        "run_s": calls * latency_s,
        "makespan_s": round(makespan, 2),
        "utilisation": round(busy / (run_workers * makespan), 4),
        "steady_utilisation": round(busy / (run_workers * (last - first)), 4),
        "sessions_per_min": round(sessions / makespan * 60, 1),
    }


class AckingNodes:
    """Nodes that acknowledge every dispatch at once (in-process transport)."""

    def __init__(self) -> None:
        self.posts = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.posts += 1
        dispatch = SessionDispatch.model_validate_json(request.content)
        info = NodeSessionInfo(
            session_id=dispatch.session_id,
            task_id=dispatch.task.task_id,
            node_id=request.url.host,
            status=SessionStatus.REGISTERED,
            stage_started_at=0.0,
        )
        return httpx.Response(201, content=info.model_dump_json())


async def scheduler(sessions: int, nodes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        config = RolloutServerConfig(
            data_dir=Path(tmp),
            dispatch_interval_s=0.01,
            dispatch_retry=RetryPolicy(initial_s=0.01, max_s=0.05),
        )
        acking = AckingNodes()
        client = httpx.AsyncClient(transport=httpx.MockTransport(acking))
        service = RolloutService(config, client=client)
        await service.start()
        for n in range(nodes):
            status = NodeStatus(
                node_id=f"node-{n}",
                url=f"http://node-{n}",
                workers=Workers(init=4, run=16, postrun=4, ready_buffer=16, queue_limit=10_000),
            )
            await service.register(NodeReport(status=status))
        began = time.perf_counter()
        await service.submit(TaskRequest(task_id="queued", instruction="x", num_samples=sessions))
        while service.store.unassigned(1) or service.store.unacknowledged():
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - began
        per_node = [
            sum(1 for v in service.session_views("queued") if v.node_id == f"node-{n}")
            for n in range(nodes)
        ]
        await service.stop()
    loads = [NodeLoad(f"n{i}", 16, 4, 4, capacity=10**9) for i in range(nodes)]
    choose_began = time.perf_counter()
    for _ in range(sessions):
        node = choose_node(loads)
        assert node is not None
        node.assign()
    choose_s = time.perf_counter() - choose_began
    return {
        "sessions": sessions,
        "nodes": nodes,
        "submit_to_all_acked_s": round(elapsed, 3),
        "per_session_ms": round(elapsed / sessions * 1000, 3),
        "choice_per_session_us": round(choose_s / sessions * 1e6, 2),
        "posts": acking.posts,
        "spread": f"{min(per_node)}-{max(per_node)}",
    }


def table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sessions")
    parser.add_argument("--sessions", type=int, default=400)
    parser.add_argument("--run-workers", type=int, default=8)
    parser.add_argument("--calls", type=int, default=4, help="model calls per harness run")
    parser.add_argument("--latency", type=float, default=0.025, help="seconds per model call")
    parser.add_argument("--start-ratio", type=float, default=2.0, help="runtime start / run")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="16 sessions, 50 scheduled (CI)")
    args = parser.parse_args(argv)
    sessions = 16 if args.smoke else 120 if args.quick else args.sessions
    run_s = args.calls * args.latency
    start_s = args.start_ratio * run_s
    # Enough INIT workers (and READY slots, which bound runtimes prepared ahead) to prepare
    # sessions as fast as the run slots finish them: run_workers x start / run, plus margin.
    init_workers = int(args.run_workers * args.start_ratio) + args.run_workers
    common = dict(
        sessions=sessions,
        run_workers=args.run_workers,
        start_s=start_s,
        calls=args.calls,
        latency_s=args.latency,
    )
    rows = [
        asyncio.run(pools(ready_buffer=init_workers, init_workers=init_workers, **common)),
        asyncio.run(pools(ready_buffer=0, init_workers=1, **common)),
    ]
    sched = [asyncio.run(scheduler(50 if args.smoke else 1000, 8))]
    if args.json:
        json.dump({"pools": rows, "scheduler": sched}, sys.stdout, indent=2)
        print()
    else:
        print(table(rows))
        print()
        print(table(sched))
    return 0


if __name__ == "__main__":
    sys.exit(main())
