"""Gateway overhead: what the Polar gateway adds to a model call, per provider, and vs LiteLLM.

Processes, each with its own GIL: the fake engine (bench/_fake_engine.py, precomputed vLLM
replies), the Polar gateway (``polar serve-gateway``: one uvicorn process, SQLite capture on
local disk, every record committed before its reply leaves), LiteLLM's proxy (one worker, from
its own venv, see below), and this process, the load generator (bench/_load.py).

Added latency = latency through the gateway - latency of the equivalent call sent straight to the
fake engine (the gateway's own upstream chat body, built with Polar's adapters), at the same
load; p50/p99 are differences of percentiles. Sessions are closed loops, in two loads:

* saturation: every session sends its next call as soon as the last reply is in, so req/s is the
  most the gateway serves; at 32 and 256 sessions the latency is queueing behind other sessions;
* paced (``--paced SESSIONS:THINK_MS``): every session waits a random think time (uniform, with
  that mean) before each call, standing for generation and tool time, so the latency is what the
  gateway adds while it keeps up (agent sessions spend most of their time away from it).

Gateway CPU ms/req is the server process's user+system CPU time (all threads) over the cell,
per call: unlike latency it barely depends on what else the machine is running.

LiteLLM (optional) gets the same Anthropic bodies on its ``/v1/messages`` and translates them to
chat completions for the same fake engine; its baseline is the same chat body without Polar's
token-id flags. Install it apart from Polar's dependencies:

    python3 -m venv bench/.venv-litellm && bench/.venv-litellm/bin/pip install 'litellm[proxy]'

Run from the repository root: ``.venv/bin/python bench/gateway_overhead.py`` (the full run took
27 min on 2 shared cores, most of it LiteLLM's cells; ``--quick``, 1 and 32 sessions with few
calls, under 3 min; ``--smoke``, every provider and stream mode once in tiny cells, what CI
runs). The markdown report goes to stdout; ``--keep`` keeps logs and the capture
DB (about 45 KB per Claude-Code-sized call).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bodies
from _load import CellResult, Connection, encode_request, run_cell
from polar.engines.vllm import VLLMEngine
from polar.gateway.config import GatewayConfig
from polar.gateway.policy import apply_policy
from polar.providers.base import RequestContext
from polar.providers.registry import PROVIDERS

ROOT = Path(__file__).resolve().parent.parent
LITELLM_VENV = ROOT / "bench" / ".venv-litellm"
HOST = "127.0.0.1"
SERVED_MODEL = "bench-model"
GEMINI_MODEL = "gemini-2.5-pro"
# LiteLLM refuses to start without a master key; checking it is part of its per-request cost.
LITELLM_KEY = "sk-bench-" + "0123456789abcdef" * 4
# Fields Polar adds to ask the engine for token ids; a plain proxy's upstream body lacks them.
_TOKEN_FLAGS = ("return_token_ids", "logprobs", "top_logprobs")

CaseKey = tuple[str, str, bool]  # (body name, provider, stream)


# -- processes --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@contextmanager
def process(
    name: str, argv: list[str], port: int, env: dict[str, str], work: Path, health: str = "/health"
) -> Iterator[int]:
    """Run a server, wait for its health route, yield its pid, and stop it (only it) afterwards."""
    log_path = work / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(name, port, health, proc, log_path)
            yield proc.pid
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_healthy(
    name: str, port: int, health: str, proc: subprocess.Popen[bytes], log: Path
) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with socket.create_connection((HOST, port), timeout=1) as s:
                s.sendall(f"GET {health} HTTP/1.1\r\nhost: {HOST}\r\n\r\n".encode())
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{name} did not become healthy on port {port}:\n{log.read_text()[-3000:]}")


async def post_json(port: int, path: str, body: bytes, headers: dict[str, str]) -> Any:
    conn = Connection(HOST, port)
    status, reply = await conn.request(encode_request("POST", HOST, path, body, headers))
    await conn.close()
    if status >= 300:
        raise RuntimeError(f"POST {path}: HTTP {status}: {reply[:500]!r}")
    return orjson.loads(reply)


def litellm_config(path: Path, engine_port: int) -> None:
    entries = "".join(
        f"  - model_name: {model}\n"
        f"    litellm_params:\n"
        f"      model: openai/{SERVED_MODEL}\n"
        f"      api_base: http://{HOST}:{engine_port}/v1\n"
        f"      api_key: sk-fake\n"
        for model in sorted({_bodies.conversation(n).model for n in _bodies.BODIES})
    )
    path.write_text(
        "model_list:\n"
        + entries
        + "litellm_settings:\n  drop_params: true\n  telemetry: false\n"
        # Recent LiteLLM sends /v1/messages for openai/ models to /v1/responses; the engines
        # Polar fronts (vLLM, SGLang) are driven through chat completions, so ask for that.
        + "  use_chat_completions_url_for_anthropic_messages: true\n"
        + f"general_settings:\n  master_key: {LITELLM_KEY}\n"
    )


# -- request shapes ---------------------------------------------------------------------------


@dataclass
class Case:
    """One request shape: the gateway-bound body and the equivalent direct engine calls."""

    provider: str
    stream: bool
    body: bytes
    direct: bytes  # Polar's upstream body, as Polar sends it
    plain_direct: bytes  # the same without token-id flags, streamed if the client streams

    def gateway_request(self, key: str) -> bytes:
        path = "/s/" + key + _bodies.path(self.provider, self.stream, GEMINI_MODEL)
        return encode_request("POST", HOST, path, self.body, _bodies.headers(self.provider, key))

    def litellm_request(self) -> bytes:
        headers = _bodies.headers("anthropic", LITELLM_KEY)
        return encode_request("POST", HOST, "/v1/messages", self.body, headers)


def upstream_body(
    engine: VLLMEngine, provider: str, body: dict[str, Any], stream: bool
) -> dict[str, Any]:
    """The chat body Polar's gateway sends the engine for ``body`` (its own adapters and policy)."""
    route, _, query = _bodies.path(provider, stream, GEMINI_MODEL).partition("?")
    ctx = RequestContext(path=route, query=dict([query.split("=")]) if query else {})
    normalized = PROVIDERS.create(provider).parse_request(body, ctx)
    apply_policy(normalized, GatewayConfig(served_model=SERVED_MODEL))
    return engine.build_body(normalized)


def build_cases(body_names: list[str], providers: list[str]) -> dict[CaseKey, Case]:
    engine = VLLMEngine("http://unused")  # only its build_body is used
    cases = {}
    for name in body_names:
        for provider in providers:
            for stream in (False, True):
                body = _bodies.body(name, provider, stream)
                upstream = upstream_body(engine, provider, body, stream)
                plain = {k: v for k, v in upstream.items() if k not in _TOKEN_FLAGS}
                plain["stream"] = stream
                cases[(name, provider, stream)] = Case(
                    provider=provider,
                    stream=stream,
                    body=orjson.dumps(body),
                    direct=chat_request(upstream),
                    plain_direct=chat_request(plain),
                )
    asyncio.run(engine.aclose())
    return cases


def chat_request(body: dict[str, Any]) -> bytes:
    return encode_request("POST", HOST, "/v1/chat/completions", orjson.dumps(body), {})


# -- measuring --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    sessions: int
    think_s: float = 0.0


@dataclass
class Row:
    label: str
    body_name: str
    stream: bool
    load: Load
    gateway: CellResult
    direct: CellResult

    @property
    def added_p50(self) -> float:
        return self.gateway.percentile(50) - self.direct.percentile(50)

    @property
    def added_p99(self) -> float:
        return self.gateway.percentile(99) - self.direct.percentile(99)

    @property
    def cpu_ms(self) -> float:
        n = len(self.gateway.latencies_ms)
        return 1000 * self.gateway.cpu_s / n if n else float("nan")


class Bench:
    def __init__(self, args: argparse.Namespace, cases: dict[CaseKey, Case], engine_port: int):
        self.args = args
        self.cases = cases
        self.engine_port = engine_port

    async def cell(
        self, port: int, requests: list[bytes], load: Load, pid: int | None
    ) -> CellResult:
        args = self.args
        if load.think_s:
            total, seconds = 10**9, args.paced_seconds
        else:
            total, seconds = (
                max(args.min_requests, load.sessions * args.per_session),
                args.max_seconds,
            )
        return await run_cell(HOST, port, requests, total, seconds, pid, args.warmup, load.think_s)

    async def direct(self, request: bytes, load: Load) -> CellResult:
        result = await self.cell(self.engine_port, [request] * load.sessions, load, None)
        check(result, "direct engine call", b'"choices"')
        return result

    async def polar(self, port: int, pid: int, loads: list[Load]) -> list[Row]:
        body = b'{"metadata":{"bench":true}}'
        n_keys = max(load.sessions for load in loads)
        admin = {"x-polar-admin-token": self.args.admin_token}  # the control API needs it
        keys = [
            (await post_json(port, "/polar/sessions", body, admin))["api_key"]
            for _ in range(n_keys)
        ]
        rows = []
        for load in loads:
            directs: dict[tuple[str, str], CellResult] = {}
            for (name, provider, stream), case in self.cases.items():
                # Polar calls the engine without streaming either way: one baseline for both.
                if (name, provider) not in directs:
                    directs[(name, provider)] = await self.direct(case.direct, load)
                direct = directs[(name, provider)]
                requests = [case.gateway_request(k) for k in keys[: load.sessions]]
                result = await self.cell(port, requests, load, pid)
                check(result, f"polar {provider} {name} stream={stream}", b"Read")
                rows.append(show(Row(provider, name, stream, load, result, direct)))
        return rows

    async def litellm(self, port: int, pid: int, loads: list[Load]) -> list[Row]:
        rows = []
        for load in loads:
            for (name, provider, stream), case in self.cases.items():
                if provider != "anthropic":
                    continue
                direct = await self.direct(case.plain_direct, load)
                result = await self.cell(port, [case.litellm_request()] * load.sessions, load, pid)
                check(result, f"litellm {name} stream={stream}", b"Read")
                rows.append(show(Row("litellm (anthropic)", name, stream, load, result, direct)))
        return rows


def check(result: CellResult, what: str, expect: bytes) -> None:
    if result.errors:
        raise RuntimeError(f"{what}: {result.errors} errors, first: {result.first_error}")
    if expect not in result.sample:
        raise RuntimeError(f"{what}: reply lacks {expect!r}: {result.sample[:400]!r}")


# -- reporting --------------------------------------------------------------------------------

HEADER = (
    "| gateway / provider | body | stream | sessions | added p50 ms | added p99 ms | req/s "
    "| gateway CPU ms/req | p50 ms gateway / direct | n |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def fmt_row(row: Row) -> str:
    g, d = row.gateway, row.direct
    return (
        f"| {row.label} | {row.body_name} | {'yes' if row.stream else 'no'} | {row.load.sessions} "
        f"| {row.added_p50:.2f} | {row.added_p99:.2f} | {g.rps:.0f} | {row.cpu_ms:.2f} "
        f"| {g.percentile(50):.2f} / {d.percentile(50):.2f} | {len(g.latencies_ms)} |"
    )


def show(row: Row) -> Row:
    print("  " + fmt_row(row), file=sys.stderr, flush=True)
    return row


def comparison(polar: list[Row], litellm: list[Row]) -> str:
    out = [
        "| body | stream | sessions | Polar req/s | LiteLLM req/s | Polar / LiteLLM "
        "| Polar CPU ms/req | LiteLLM CPU ms/req | Polar added p50 ms | LiteLLM added p50 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    mine = {(r.body_name, r.stream, r.load): r for r in polar if r.label == "anthropic"}
    for lite in litellm:
        ours = mine.get((lite.body_name, lite.stream, lite.load))
        if ours is None:
            continue
        ratio = ours.gateway.rps / lite.gateway.rps if lite.gateway.rps else float("inf")
        out.append(
            f"| {lite.body_name} | {'yes' if lite.stream else 'no'} | {lite.load.sessions} "
            f"| {ours.gateway.rps:.0f} | {lite.gateway.rps:.0f} | {ratio:.1f}x "
            f"| {ours.cpu_ms:.2f} | {lite.cpu_ms:.2f} | {ours.added_p50:.2f} | {lite.added_p50:.2f} |"
        )
    return "\n".join(out)


def body_sizes(names: list[str]) -> str:
    sizes = []
    for name in names:
        each = [
            f"{p} {len(orjson.dumps(_bodies.body(name, p, False))) / 1000:.1f} KB"
            for p in _bodies.PROVIDERS
        ]
        sizes.append(f"{name} ({', '.join(each)})")
    return "; ".join(sizes)


def report(args: argparse.Namespace, polar: list[Row], litellm: list[Row]) -> str:
    parts = [
        f"Machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}. "
        f"Bodies: {body_sizes(args.bodies)}.",
    ]
    sections: list[tuple[str, list[Load]]] = [
        ("Saturation (no think time)", [Load(n) for n in args.concurrency])
    ]
    for load in args.paced:
        title = f"Paced: {load.sessions} sessions, think time mean {load.think_s * 1000:.0f} ms"
        sections.append((title, [load]))
    for title, loads in sections:
        ours = [r for r in polar if r.load in loads]
        theirs = [r for r in litellm if r.load in loads]
        parts += ["", f"#### {title}", "", HEADER, *(fmt_row(r) for r in ours + theirs)]
        # Paced req/s is the offered load, not a capacity: compare throughput only saturated.
        if theirs and not loads[0].think_s:
            parts += ["", comparison(ours, theirs)]
    return "\n".join(parts)


# -- main -------------------------------------------------------------------------------------


async def measure(args: argparse.Namespace, cases: dict[CaseKey, Case], work: Path) -> str:
    engine_port, gateway_port = free_port(), free_port()
    env = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    engine_argv = [
        sys.executable,
        str(ROOT / "bench" / "_fake_engine.py"),
        "--port",
        str(engine_port),
    ]
    gateway_argv = [
        sys.executable, "-m", "polar.cli.main", "serve-gateway",
        "--engine", "vllm", "--engine-url", f"http://{HOST}:{engine_port}",
        "--served-model", SERVED_MODEL, "--port", str(gateway_port),
        "--capture-db", str(work / "captures.db"), "--admin-token", args.admin_token,
    ]  # fmt: skip
    loads = [Load(n) for n in args.concurrency] + args.paced
    started = time.monotonic()
    litellm: list[Row] = []
    with process("engine", engine_argv, engine_port, env, work):
        bench = Bench(args, cases, engine_port)
        with process("gateway", gateway_argv, gateway_port, env, work) as pid:
            polar = await bench.polar(gateway_port, pid, loads)
        print(f"polar done after {time.monotonic() - started:.0f} s", file=sys.stderr)
        if args.litellm and "anthropic" in args.providers:
            litellm = await run_litellm(bench, loads, work)
            print(f"litellm done after {time.monotonic() - started:.0f} s", file=sys.stderr)
    return report(args, polar, litellm)


async def run_litellm(bench: Bench, loads: list[Load], work: Path) -> list[Row]:
    binary = LITELLM_VENV / "bin" / "litellm"
    if not binary.exists():
        print(f"LiteLLM skipped: {binary} is missing (see the module docstring)", file=sys.stderr)
        return []
    port = free_port()
    config = work / "litellm.yaml"
    litellm_config(config, bench.engine_port)
    env = os.environ | {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    env.pop("PYTHONPATH", None)
    argv = [str(binary), "--config", str(config), "--host", HOST, "--port", str(port)]
    argv += ["--num_workers", "1"]
    # LiteLLM's /health needs the key; /health/liveliness is its open probe.
    with process("litellm", argv, port, env, work, "/health/liveliness") as pid:
        return await bench.litellm(port, pid, loads)


def parse_load(text: str) -> Load:
    sessions, _, think_ms = text.partition(":")
    return Load(int(sessions), float(think_ms) / 1000)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Polar gateway overhead against a fast fake engine.")
    p.add_argument("--quick", action="store_true", help="1 and 32 sessions, few requests (~3 min)")
    p.add_argument("--concurrency", default="1,32,256", help="saturation session counts")
    p.add_argument(
        "--paced",
        default="32:1000,256:8000",
        help="paced loads as SESSIONS:THINK_MS, comma-separated ('' for none)",
    )
    p.add_argument("--providers", default=",".join(_bodies.PROVIDERS))
    p.add_argument("--bodies", default=",".join(_bodies.BODIES))
    p.add_argument(
        "--min-requests", type=int, default=400, help="measured calls per cell, at least"
    )
    p.add_argument(
        "--per-session", type=int, default=4, help="measured calls per session, at least"
    )
    p.add_argument("--max-seconds", type=float, default=30.0, help="cap per saturation cell")
    p.add_argument("--paced-seconds", type=float, default=10.0, help="length of each paced cell")
    p.add_argument("--warmup", type=int, default=20, help="unmeasured calls per cell")
    p.add_argument("--no-litellm", dest="litellm", action="store_false")
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs, capture DB)")
    p.add_argument("--smoke", action="store_true", help="every path once, tiny cells (CI, ~20 s)")
    args = p.parse_args(argv)
    args.admin_token = secrets.token_urlsafe(24)
    if args.smoke:
        args.concurrency, args.paced, args.bodies, args.litellm = "2", "2:50", "pi", False
        args.min_requests, args.per_session, args.max_seconds = 4, 1, 2.0
        args.paced_seconds, args.warmup = 0.5, 1
    elif args.quick:
        args.concurrency, args.paced = "1,32", "32:1000"
        args.min_requests, args.per_session, args.max_seconds = 50, 1, 4.0
        args.paced_seconds, args.warmup = 2.0, 10
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    args.paced = [parse_load(x) for x in args.paced.split(",") if x]
    args.providers = args.providers.split(",")
    args.bodies = args.bodies.split(",")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="polar-gw-bench-"))
    try:
        cases = build_cases(args.bodies, args.providers)
        print(asyncio.run(measure(args, cases, work)))
    finally:
        if args.keep:
            print(f"work dir kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
