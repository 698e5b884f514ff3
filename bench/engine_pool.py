"""Benchmark session-affine routing over engine replicas: prefix-cache hits from the engines' own
counters (vLLM's ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` on ``/metrics``).

The same multi-turn agent sessions (a shared system prompt, a task per session, each turn adds
the reply and a tool result of fresh text) run through a real gateway three times:

* ``single``: one replica serves every call (the ceiling: nothing is ever on the wrong replica);
* ``round_robin``: calls rotate over the replicas whatever their session (the baseline of a
  router with no session key);
* ``affinity``: the engine pool, each session on one replica.

Before each mode every replica's prefix cache is reset (``POST /reset_prefix_cache``, which vLLM
serves when started with ``VLLM_SERVER_DEV_MODE=1``); the hit ratio is the counters' delta.
Turns interleave over sessions as concurrent agents would (in a shuffled order each turn), greedy, ``--tokens`` per call.

    python bench/engine_pool.py --urls http://127.0.0.1:8201,http://127.0.0.1:8202
    python bench/engine_pool.py --smoke    # 2 scripted replicas, no cache counters: seconds (CI)
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from polar.capture.store import CaptureStore
from polar.engines.base import Engine
from polar.engines.openai_compat import read_prefix_cache
from polar.engines.pool import EnginePool, Replica
from polar.engines.registry import EngineConfig
from polar.engines.scripted import Script, ScriptedBackend, create_scripted_app
from polar.engines.types import PrefixCacheCounters
from polar.engines.vllm import VLLMEngine
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.server import BackgroundServer
from polar.gateway.services import app_services
from polar.rendering.model_files import load_tokenizer

SYSTEM = (
    "You are a coding agent working in a repository checkout. You can run shell commands "
    "with the bash tool and read their output. Work step by step: inspect the files, make a "
    "plan, edit, run the tests, and report what you changed. Keep answers short. "
) * 4


class RoundRobinPool(EnginePool):
    """The baseline: every call to the next replica, whatever its session."""

    def __init__(self, replicas: list[Replica]) -> None:
        super().__init__(replicas)
        self._next = 0

    def _choose(self, session_id: str | None) -> tuple[Replica, bool]:
        replica = self.replicas[self._next % len(self.replicas)]
        self._next += 1
        return replica, False


class CacheProbe:
    """Reads and resets the replicas' own prefix-cache counters over HTTP."""

    def counters(self, urls: list[str]) -> dict[str, PrefixCacheCounters | None]:
        out: dict[str, PrefixCacheCounters | None] = {}
        for url in urls:
            reply = httpx.get(f"{url}/metrics", timeout=10)
            out[url] = read_prefix_cache(reply.text) if reply.status_code == 200 else None
        return out

    def reset(self, urls: list[str]) -> None:
        for url in urls:
            httpx.post(f"{url}/reset_prefix_cache", timeout=30).raise_for_status()


class NoCache(CacheProbe):
    """Scripted replicas keep no prefix cache: routing is measured, not hits."""

    def counters(self, urls: list[str]) -> dict[str, PrefixCacheCounters | None]:
        return dict.fromkeys(urls)

    def reset(self, urls: list[str]) -> None:
        return None


def _pool(mode: str, urls: list[str], transports: dict[str, Any]) -> Engine:
    def engine(url: str) -> VLLMEngine:
        return VLLMEngine(url, transport=transports.get(url), timeout_s=600)

    if mode == "single":
        return EnginePool([Replica("r0", engine(urls[0]))])
    replicas = [Replica(f"r{i}", engine(url)) for i, url in enumerate(urls)]
    return RoundRobinPool(replicas) if mode == "round_robin" else EnginePool(replicas)


def run_mode(
    mode: str, args: argparse.Namespace, transports: dict[str, Any], probe: CacheProbe
) -> dict[str, Any]:
    urls: list[str] = args.urls
    probe.reset(urls)
    before = probe.counters(urls)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "c.db"
        config = GatewayConfig(
            capture_db=db,
            served_model=args.model,
            render={"mode": "gateway", "tokenizer": args.tokenizer},
            engine=EngineConfig(kind="vllm", replicas=list(urls)),
        )
        store = CaptureStore(db)
        app = create_app(config, engine=_pool(mode, urls, transports), store=store)
        admin = {"x-polar-admin-token": app_services(app).admin_token or ""}
        started = time.perf_counter()
        with BackgroundServer(app) as server:
            keys = [
                httpx.post(f"{server.url}/polar/sessions", json={}, headers=admin).json()["api_key"]
                for _ in range(args.sessions)
            ]
            histories = [
                [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"Task {i}: fix failing test number {i * 7}."},
                ]
                for i in range(args.sessions)
            ]
            for turn in range(args.turns):
                # Agents reach their next call in a different order every turn (seeded: every
                # mode sees the same order).
                for i in random.Random(turn).sample(range(len(keys)), len(keys)):
                    key, messages = keys[i], histories[i]
                    reply = httpx.post(
                        f"{server.url}/s/{key}/v1/chat/completions",
                        json={
                            "model": "m",
                            "messages": messages,
                            "max_tokens": args.tokens,
                            "temperature": 0,
                        },
                        timeout=600,
                    )
                    reply.raise_for_status()
                    messages.append(reply.json()["choices"][0]["message"])
                    messages.append(
                        {
                            "role": "user",
                            "content": f"$ pytest -k case{i}_{turn}\n" + _output(i, turn),
                        }
                    )
            wall = time.perf_counter() - started
            engines = {key: {r.engine for r in store.records(key)} for key in keys}
    after = probe.counters(urls)
    delta = {
        url: PrefixCacheCounters(a.queries - b.queries, a.hits - b.hits)
        for url in urls
        if (a := after[url]) is not None and (b := before[url]) is not None
    }
    total = sum(delta.values(), PrefixCacheCounters(0.0, 0.0)) if delta else None
    return {
        "mode": mode,
        "calls": args.sessions * args.turns,
        "wall_s": wall,
        "one_replica_per_session": all(len(e) == 1 for e in engines.values()),
        "sessions_per_replica": Counter(next(iter(e)) for e in engines.values() if len(e) == 1),
        "queries": total.queries if total else None,
        "hits": total.hits if total else None,
        "ratio": total.hit_ratio if total else None,
    }


def _output(session: int, turn: int) -> str:
    """A tool result of fresh text: each session's context grows by unique tokens."""
    return "\n".join(
        f"tests/test_mod{session}.py::test_case_{turn}_{n} {'PASSED' if n % 3 else 'FAILED'}"
        for n in range(12)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--urls", type=lambda s: s.split(","), default=[])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--tokenizer", default=None, help="default: SmolLM2's")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--smoke", action="store_true", help="2 scripted replicas (CI)")
    args = parser.parse_args()
    transports: dict[str, Any] = {}
    if args.smoke:
        tokenizer = load_tokenizer()
        args.urls = ["http://replica-0", "http://replica-1"]
        for url in args.urls:
            backend = ScriptedBackend(Script(), tokenizer=tokenizer, model_name=args.model)
            transports[url] = httpx.ASGITransport(app=create_scripted_app(backend))
        args.sessions, args.turns = 4, 3
    if len(args.urls) < 2:
        parser.error("give two or more replica URLs with --urls (or --smoke)")
    probe = NoCache() if args.smoke else CacheProbe()
    print(
        f"{args.sessions} sessions x {args.turns} turns, {len(args.urls)} replicas, {args.tokens} tokens/call"
    )
    print(
        f"{'mode':<12} {'calls':>5} {'queried':>9} {'hit':>9} {'ratio':>6} {'wall s':>7}  sessions/replica"
    )
    rows = [
        run_mode(mode, args, transports, probe) for mode in ("single", "round_robin", "affinity")
    ]
    for row in rows:
        ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "n/a"
        queried = f"{row['queries']:.0f}" if row["queries"] is not None else "n/a"
        hits = f"{row['hits']:.0f}" if row["hits"] is not None else "n/a"
        spread = dict(row["sessions_per_replica"]) if row["one_replica_per_session"] else "mixed"
        print(
            f"{row['mode']:<12} {row['calls']:>5} {queried:>9} {hits:>9} {ratio:>6} {row['wall_s']:>7.1f}  {spread}"
        )
    single, affinity = rows[0]["ratio"], rows[2]["ratio"]
    if single and affinity is not None:
        print(f"affinity keeps {affinity / single:.1%} of the single replica's hit ratio")
    assert rows[2]["one_replica_per_session"], "affinity put a session on two replicas"


if __name__ == "__main__":
    main()
