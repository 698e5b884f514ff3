"""Benchmark reading a big task from the rollout server: GET /tasks/{id}, its summary, and
whether other requests wait while it is answered.

A 64-sample task whose sessions each return a 16k-token trajectory (prompt, response, loss mask
and logprobs) is finished on a real rollout server (SQLite store, uvicorn on loopback). Then:

1. ``GET /tasks/{id}`` latency, whole answer read and time to its first byte: today's path
   (a completed task's answer spliced once from the stored result documents in a worker thread,
   then sent as a file) against the old one (every result parsed into pydantic models and
   re-serialized, on the event loop), both through the same server;
2. ``GET /tasks/{id}/summary`` latency (what a waiting client reads);
3. ``GET /health`` latency while 4 clients keep reading the whole task: the event loop is free
   when it stays near its idle latency.

    python bench/task_status.py            # ~1 min
    python bench/task_status.py --quick
    python bench/task_status.py --smoke    # 2 small sessions: seconds (CI)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi import Request

from polar.gateway.server import BackgroundServer
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig
from polar.schemas.task import SessionResult, SessionStatus, TaskRequest
from polar.schemas.trajectory import Trace, Trajectory, TrajectoryStatus


def trajectory(tokens: int, rng: random.Random) -> Trajectory:
    prompt = tokens // 4
    response = tokens - prompt
    trace = Trace(
        prompt_ids=[rng.randrange(49152) for _ in range(prompt)],
        response_ids=[rng.randrange(49152) for _ in range(response)],
        loss_mask=[int(rng.random() < 0.7) for _ in range(response)],
        response_logprobs=[-rng.random() * 3 for _ in range(response)],
    )
    return Trajectory(status=TrajectoryStatus.COMPLETED, traces=[trace])


def timed(http: httpx.Client, path: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        reply = http.get(path)
        out.append((time.perf_counter() - started) * 1000)
        assert reply.status_code == 200, reply.text[:200]
    return out


def first_byte(http: httpx.Client, path: str, n: int) -> list[float]:
    """Milliseconds until the answer starts (its status line and first bytes)."""
    out = []
    for _ in range(n):
        started = time.perf_counter()
        with http.stream("GET", path) as reply:
            chunks = reply.iter_raw()
            next(chunks)
            out.append((time.perf_counter() - started) * 1000)
            for _ in chunks:
                pass
    return out


def stats(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {
        "p50_ms": round(statistics.median(ordered), 2),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 2),
        "mean_ms": round(statistics.fmean(ordered), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="2 small sessions, 2 reads (CI)")
    args = parser.parse_args()
    samples, reads = (16, 5) if args.quick else (args.samples, 20)
    if args.smoke:
        samples, reads, args.tokens = 2, 2, 256
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        # auth off (loopback only): the results are posted here, not by the nodes they would
        # have been dispatched to, which is all auth would let through.
        config = RolloutServerConfig(data_dir=Path(tmp), auth=False)
        app = create_rollout_app(config)
        service = app.state.service

        @app.get("/old/tasks/{task_id}")
        async def old_get_task(request: Request, task_id: str) -> Any:
            # The path before issue 13: parse every result, re-serialize, on the event loop.
            return service.task_result(task_id)

        with BackgroundServer(app) as server, httpx.Client(base_url=server.url, timeout=60) as http:
            request = TaskRequest(task_id="big", instruction="x", num_samples=samples)
            assert (
                http.post(
                    "/tasks",
                    content=request.model_dump_json(),
                    headers={"content-type": "application/json"},
                ).status_code
                == 201
            )
            shape = trajectory(args.tokens, rng)
            for view in http.get("/tasks/big/sessions").json():
                result = SessionResult(
                    session_id=view["session_id"],
                    task_id="big",
                    status=SessionStatus.COMPLETED,
                    reward=1.0,
                    trajectory=shape,
                )
                reply = http.post(
                    "/results",
                    content=result.model_dump_json(),
                    headers={"content-type": "application/json"},
                )
                assert reply.status_code == 200, reply.text
            size = len(http.get("/tasks/big").content)
            now = timed(http, "/tasks/big", reads)
            old = timed(http, "/old/tasks/big", reads)
            now_first = first_byte(http, "/tasks/big", reads)
            old_first = first_byte(http, "/old/tasks/big", reads)
            summary = timed(http, "/tasks/big/summary", reads * 5)
            idle = timed(http, "/health", 50)

            stop = threading.Event()

            def reader(path: str) -> None:
                with httpx.Client(base_url=server.url, timeout=120) as own:
                    while not stop.is_set():
                        own.get(path)

            busy: dict[str, list[float]] = {}
            for label, path in (("new", "/tasks/big"), ("old", "/old/tasks/big")):
                threads = [threading.Thread(target=reader, args=(path,)) for _ in range(4)]
                for t in threads:
                    t.start()
                time.sleep(0.5)
                busy[label] = timed(http, "/health", 30)
                stop.set()
                for t in threads:
                    t.join()
                stop.clear()

    report = {
        "samples": samples,
        "tokens_per_trajectory": args.tokens,
        "answer_mb": round(size / 1e6, 1),
        "get_task_new": stats(now),
        "get_task_old": stats(old),
        "get_task_first_byte_new": stats(now_first),
        "get_task_first_byte_old": stats(old_first),
        "get_task_summary": stats(summary),
        "health_idle": stats(idle),
        "health_while_4_readers_new": stats(busy["new"]),
        "health_while_4_readers_old": stats(busy["old"]),
    }
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
