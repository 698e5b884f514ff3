"""Engine-side vs gateway-side rendering on multi-turn tool sessions against a real engine.

An independent tap sits between the gateway and the engine and keeps the prompt ids the engine
reports for every call. Sessions are driven like a harness does: the model's replies go back
into the history (tool-call arguments re-serialized compactly, as harnesses store them), tool
results and follow-up user turns are added. For each render mode it reports calls per trace,
how many merged calls saw exactly the trace's context according to the TAP (not the builder),
and the gateway process's CPU per call.

    python bench/render_modes.py --engine-url http://127.0.0.1:8000 --sessions 6 --turns 5
    python bench/render_modes.py --smoke      # the scripted engine, one short session (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson
from openai import AsyncOpenAI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from polar.capture.records import CaptureRecord
from polar.capture.store import CaptureStore
from polar.engines.scripted import Script, ScriptedBackend, create_scripted_app
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.server import BackgroundServer
from polar.rendering.model_files import load_tokenizer
from polar.stack.engine_check import BASH_TOOL, SYSTEM
from polar.trajectory.prefix_merging import PrefixMergingBuilder

TOOLS = [BASH_TOOL]  # the tool polar check-engine's sessions use
TASKS = [
    "List the files in the current directory with the bash tool.",
    "Use bash to print the date, then tell me the year.",
    "Create a file named notes.txt with bash and show its contents.",
    "Count the lines of /etc/hostname using bash.",
]


class Tap:
    """A reverse proxy that keeps, per engine call, the prompt ids the engine itself reports.

    Calls are keyed by the engine's own response id, which the gateway records as
    ``engine_completion_id``: two calls may sample the same ids (the same short tool call in two
    sessions), so the sampled ids cannot tell them apart."""

    def __init__(self, engine_url: str) -> None:
        self.engine_url = engine_url.rstrip("/")
        # engine response id -> (engine prompt ids, sampled ids)
        self.calls: dict[str, tuple[list[int], list[int]]] = {}
        self.client = httpx.AsyncClient(base_url=self.engine_url, timeout=600)

    def app(self) -> Starlette:
        async def forward(request: Request) -> Response:
            body = await request.body()
            reply = await self.client.request(
                request.method,
                request.url.path,
                content=body,
                headers={"content-type": "application/json"},
            )
            if request.url.path.endswith("completions") and reply.status_code == 200:
                data = orjson.loads(reply.content)
                choice = data["choices"][0]
                prompt = choice.get("prompt_token_ids") or data.get("prompt_token_ids")
                self.calls[str(data["id"])] = (list(prompt), list(choice.get("token_ids") or []))
            return Response(
                reply.content, status_code=reply.status_code, media_type="application/json"
            )

        return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])


async def drive(client: AsyncOpenAI, key: str, task: str, turns: int, seed: int) -> int:
    """One harness-like session; returns the number of model calls made."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task},
    ]
    calls = 0
    for turn in range(turns):
        reply = await client.chat.completions.create(
            model="any-name-the-harness-likes",
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            max_tokens=96,
            seed=seed * 100 + turn,
            extra_headers={"authorization": f"Bearer {key}"},
        )
        calls += 1
        message = reply.choices[0].message
        entry: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
        if message.tool_calls:
            entry["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {
                        "name": c.function.name,
                        # Harnesses keep arguments as parsed objects and re-serialize them.
                        "arguments": json.dumps(
                            json.loads(c.function.arguments), separators=(",", ":")
                        ),
                    },
                }
                for c in message.tool_calls
            ]
        messages.append(entry)
        if message.tool_calls:
            for c in message.tool_calls:
                messages.append(
                    {"role": "tool", "tool_call_id": c.id, "content": f"ok (turn {turn})"}
                )
        else:
            messages.append({"role": "user", "content": "Good. Now do one more step."})
    return calls


async def run_mode(engine_url: str, mode: str, sessions: int, turns: int) -> dict[str, Any]:
    tap = Tap(engine_url)
    workdir = Path(tempfile.mkdtemp(prefix=f"polar-render-{mode}-"))
    with BackgroundServer(tap.app()) as tap_server:
        config = GatewayConfig(
            capture_db=workdir / "captures.db",
            auto_register=True,
            engine={"kind": "vllm", "base_url": tap_server.url},
            render={"mode": mode},
            sampling={"temperature": 1.0, "top_p": 1.0},
        )
        store = CaptureStore(config.capture_db)
        app = create_app(config, store=store)
        with BackgroundServer(app) as gateway:
            keys = [f"bench-{mode}-{i}" for i in range(sessions)]
            async with AsyncOpenAI(
                base_url=gateway.url + "/v1", api_key="unused", max_retries=0
            ) as client:
                cpu0, wall0 = time.process_time(), time.perf_counter()
                counts = await asyncio.gather(
                    *(
                        drive(client, key, TASKS[i % len(TASKS)], turns, seed=i)
                        for i, key in enumerate(keys)
                    )
                )
                cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            captured = {key: store.records(key) for key in keys}
    await tap.client.aclose()
    totals: Counter[str] = Counter()
    for key in keys:
        records = captured[key]
        by_id = {r.completion_id: r for r in records}
        for builder, tag in ((PrefixMergingBuilder(), "exact"), (_tolerant(), "tolerant")):
            trajectory = builder.build(records)
            totals[f"{tag}_traces"] += len(trajectory.traces)
            for trace in trajectory.traces:
                context = list(trace.prompt_ids)
                position = 0
                for index, cid in enumerate(trace.stats.completion_ids):
                    rec = by_id[cid]
                    n = len(rec.prompt_ids) - len(context)
                    seen = context + trace.response_ids[position : position + max(n, 0)]
                    if index:
                        totals[f"{tag}_merged"] += 1
                        # The TAP's record of what the engine conditioned on, not the builder's.
                        if seen == _engine_prompt(tap, rec):
                            totals[f"{tag}_exact"] += 1
                    position += max(n, 0) + len(rec.sampled_ids)
                    context = list(rec.prompt_ids) + list(rec.sampled_ids)
        totals["calls"] += len(records)
        totals["spliced"] += sum("prompt_extends_sampled_turn" in r.flags for r in records)
        totals["tool_calls"] += sum(bool(r.response.get("tool_calls")) for r in records)
    return {
        "mode": mode,
        "sessions": sessions,
        "calls": totals["calls"],
        "driven_calls": sum(counts),
        "tool_call_turns": totals["tool_calls"],
        "spliced_prompts": totals["spliced"],
        "traces_exact": totals["exact_traces"],
        "calls_per_trace_exact": round(totals["calls"] / max(1, totals["exact_traces"]), 2),
        "merged_exact_builder": totals["exact_merged"],
        "context_exact_exact_builder": totals["exact_exact"],
        "traces_tolerant": totals["tolerant_traces"],
        "merged_tolerant_builder": totals["tolerant_merged"],
        "context_exact_tolerant_builder": totals["tolerant_exact"],
        "cpu_ms_per_call": round(1000 * cpu / max(1, totals["calls"]), 2),
        "wall_s": round(wall, 1),
    }


def _engine_prompt(tap: Tap, record: CaptureRecord) -> list[int] | None:
    """The prompt ids the engine reported for this record's call (None if the tap has no such
    call, or its sampled ids differ from the record's)."""
    call = tap.calls.get(record.engine_completion_id or "")
    if call is None or call[1] != list(record.sampled_ids):
        return None
    return call[0]


def _tolerant() -> PrefixMergingBuilder:
    return PrefixMergingBuilder({"context": "tolerant"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engine-url", help="a vLLM or SGLang server (required but for --smoke)")
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=["engine", "gateway"])
    parser.add_argument(
        "--smoke", action="store_true", help="the scripted engine, 1 session of 2 turns (CI)"
    )
    args = parser.parse_args()
    if not args.smoke and not args.engine_url:
        parser.error("--engine-url is required (or --smoke)")
    with contextlib.ExitStack() as stack:
        if args.smoke:
            args.sessions, args.turns = 1, 2
            args.engine_url = stack.enter_context(scripted_engine()).url
        for mode in args.modes:
            result = asyncio.run(run_mode(args.engine_url, mode, args.sessions, args.turns))
            print(json.dumps(result))


def scripted_engine() -> BackgroundServer:
    """Polar's scripted engine (SmolLM2's tokenizer, vLLM's token fields) on a loopback port:
    what ``--smoke`` runs against instead of a real engine."""
    backend = ScriptedBackend(Script(), tokenizer=load_tokenizer())
    return BackgroundServer(create_scripted_app(backend))


if __name__ == "__main__":
    main()
