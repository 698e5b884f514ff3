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

* 1 to 1,000 sessions (``--scale``, ``--scale-loads SESSIONS:THINK_MS:SECONDS``): one paced mix
  per load, every session cycling through all APIs, streamed and not; added p50/p99 per API,
  added time to first byte and to first content event for streams, gateway CPU per call and its
  run-queue wait, RSS per session, descriptors, and every acknowledged call checked against the
  store (``polar capture verify``); ``--engine-token-ms`` paces the fake engine as generating.

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
import json
import os
import re
import resource
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
from _load import (
    Call,
    CellResult,
    Connection,
    MixResult,
    encode_request,
    percentile,
    process_cpu_s,
    process_fds,
    process_rss_kib,
    run_cell,
    run_paced_mix,
)
from polar.engines.vllm import VLLMEngine
from polar.gateway.config import GatewayConfig
from polar.gateway.policy import apply_policy
from polar.providers.base import RequestContext
from polar.providers.registry import PROVIDERS
from polar.serving import raise_descriptor_limit

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


# -- 1 to 1,000 paced sessions (--scale) -------------------------------------------------------

# The first content event of a stream, per API (the fake engine's text starts with "I").
CONTENT_MARKERS = {
    "openai_chat": re.compile(rb'"content":"[^"]'),
    "openai_responses": re.compile(rb"response\.output_text\.delta"),
    "anthropic": re.compile(rb"content_block_delta"),
    "google": re.compile(rb'"text":"[^"]'),
}


@dataclass(frozen=True)
class ScaleLoad:
    sessions: int
    think_s: float
    seconds: float


@dataclass
class ScaleRow:
    load: ScaleLoad
    gateway: MixResult
    direct: MixResult
    rss_after_kib: int  # once the cell's connections are closed (its sessions still open)
    neighbours_cpu: tuple[float, float] = (0.0, 0.0)  # load generator, fake engine: CPU s per s


@dataclass
class ScaleRun:
    rows: list[ScaleRow]
    fresh_rss_kib: int
    fresh_fds: int
    idle_cpu_ms_per_s: float
    acknowledged: dict[str, int]  # session id -> 200 replies
    verify: dict[str, Any]
    nofile: tuple[int, int]


def call_label(provider: str, stream: bool) -> str:
    return f"{provider} {'stream' if stream else 'json'}"


def scale_calls(cases: dict[CaseKey, Case], body_name: str, key: str | None) -> list[Call]:
    """One session's kinds of call: every API, streamed and not, through the gateway (``key``)
    or straight to the engine (None: Polar's upstream body; for streams, the same streamed)."""
    calls = []
    for (name, provider, stream), case in cases.items():
        if name != body_name:
            continue
        label = call_label(provider, stream)
        if key is None:
            data = case.plain_direct if stream else case.direct
            marker = CONTENT_MARKERS["openai_chat"] if stream else None
        else:
            data = case.gateway_request(key)
            marker = CONTENT_MARKERS[provider] if stream else None
        calls.append(Call(label, data, marker))
    return calls


def check_mix(result: MixResult, what: str) -> None:
    if result.errors:
        raise RuntimeError(f"{what}: {result.errors} errors, first: {result.first_error}")


class ScaleBench:
    """The paced cells of one gateway process, over sessions registered as the loads grow."""

    def __init__(
        self, args: argparse.Namespace, cases: dict[CaseKey, Case], ports: tuple[int, int], pid: int
    ) -> None:
        self.args, self.cases, self.pid = args, cases, pid
        self.engine_port, self.gateway_port = ports
        self.acknowledged: dict[str, int] = {}  # session key -> 200 replies
        self.engine_pid = 0

    async def register(self) -> str:
        admin = {"x-polar-admin-token": self.args.admin_token}
        body = b'{"metadata":{"bench":"scale"}}'
        key = (await post_json(self.gateway_port, "/polar/sessions", body, admin))["api_key"]
        self.acknowledged[key] = 0
        return str(key)

    async def warm_up(self, key: str) -> None:
        """Every path three times (imports, first records); these calls count as acknowledged."""
        conn = Connection(HOST, self.gateway_port)
        for _ in range(3):
            for call in scale_calls(self.cases, self.args.scale_body, key):
                reply = await conn.exchange(call.data, call.marker)
                if reply.status != 200:
                    raise RuntimeError(f"warm-up {call.label}: HTTP {reply.status}")
                self.acknowledged[key] += 1
        await conn.close()

    async def row(self, load: ScaleLoad, keys: list[str]) -> ScaleRow:
        args = self.args
        direct_calls = scale_calls(self.cases, args.scale_body, None)
        direct = await run_paced_mix(
            HOST, self.engine_port, [direct_calls] * load.sessions,
            load.seconds * args.direct_share, load.think_s,
        )  # fmt: skip
        check_mix(direct, f"direct, {load.sessions} sessions")
        sessions = [scale_calls(self.cases, args.scale_body, k) for k in keys]
        own0, engine0 = time.process_time(), process_cpu_s(self.engine_pid)
        gateway = await run_paced_mix(
            HOST, self.gateway_port, sessions, load.seconds, load.think_s, self.pid
        )
        neighbours = (
            (time.process_time() - own0) / gateway.elapsed_s,
            (process_cpu_s(self.engine_pid) - engine0) / gateway.elapsed_s,
        )
        for key, n in zip(keys, gateway.acknowledged, strict=True):
            self.acknowledged[key] += n
        check_mix(gateway, f"gateway, {load.sessions} sessions")
        for label, sample in gateway.samples.items():
            if b"Read" not in sample:
                raise RuntimeError(f"{label}: reply lacks the tool call: {sample[:300]!r}")
        return ScaleRow(load, gateway, direct, process_rss_kib(self.pid), neighbours)


async def scale_measure(
    args: argparse.Namespace, cases: dict[CaseKey, Case], work: Path
) -> ScaleRun:
    engine_port, gateway_port = free_port(), free_port()
    env = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    engine_argv = [sys.executable, str(ROOT / "bench" / "_fake_engine.py")]
    engine_argv += ["--port", str(engine_port), "--token-ms", str(args.engine_token_ms)]
    db = work / "scale-captures.db"
    gateway_argv = [
        sys.executable, "-m", "polar.cli.main", "serve-gateway",
        "--engine", "vllm", "--engine-url", f"http://{HOST}:{engine_port}",
        "--served-model", SERVED_MODEL, "--port", str(gateway_port),
        "--capture-db", str(db), "--admin-token", args.admin_token,
    ]  # fmt: skip
    rows = []
    with (
        process("engine", engine_argv, engine_port, env, work) as engine_pid,
        process("scale-gateway", gateway_argv, gateway_port, env, work) as pid,
    ):
        bench = ScaleBench(args, cases, (engine_port, gateway_port), pid)
        bench.engine_pid = engine_pid
        keys = [await bench.register()]
        await bench.warm_up(keys[0])
        await asyncio.sleep(args.scale_idle_s)  # the warm-up's connection closed, settled
        fresh_rss, fresh_fds = process_rss_kib(pid), process_fds(pid)
        cpu0 = process_cpu_s(pid)
        await asyncio.sleep(args.scale_idle_s)
        idle = 1000 * (process_cpu_s(pid) - cpu0) / args.scale_idle_s
        for load in args.scale_loads:
            while len(keys) < load.sessions:
                keys.append(await bench.register())
            rows.append(await bench.row(load, keys[: load.sessions]))
            print("  " + scale_summary_row(rows[-1], fresh_rss), file=sys.stderr, flush=True)
    verify_argv = [sys.executable, "-m", "polar.cli.main", "capture", "verify", "--json", str(db)]
    done = subprocess.run(verify_argv, env=env, capture_output=True, text=True, check=False)
    verify = json.loads(done.stdout) if done.stdout.strip() else {"error": done.stderr[-2000:]}
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    return ScaleRun(rows, fresh_rss, fresh_fds, idle, bench.acknowledged, verify, nofile)


def _all(result: MixResult, what: str) -> list[float]:
    return [v for times in result.by_label.values() for v in getattr(times, what)]


def _added(row: ScaleRow, q: float, what: str = "latency_ms", label: str | None = None) -> float:
    def pick(result: MixResult) -> list[float]:
        if label is None:
            return _all(result, what)
        times = result.by_label.get(label)
        return list(getattr(times, what)) if times else []

    return percentile(pick(row.gateway), q) - percentile(pick(row.direct), q)


def _cpu_ms(row: ScaleRow) -> float:
    return 1000 * row.gateway.cpu_s / row.gateway.calls if row.gateway.calls else float("nan")


SCALE_HEADER = (
    "| sessions | think s (mean) | calls/s | calls | added p50 ms | added p99 ms "
    "| p50 / p99 ms direct | gateway CPU ms/call | gateway CPU / waiting for a CPU (s per s) "
    "| load generator / fake engine CPU (s per s) | RSS MiB (peak) | RSS KiB per session "
    "| fds (peak) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def scale_summary_row(row: ScaleRow, fresh_rss_kib: int) -> str:
    g, n = row.gateway, row.load.sessions
    direct = _all(row.direct, "latency_ms")
    per_session = (g.peak.rss_kib - fresh_rss_kib) / n
    return (
        f"| {n} | {row.load.think_s:g} | {g.calls / g.elapsed_s:.1f} | {g.calls} "
        f"| {_added(row, 50):.2f} | {_added(row, 99):.2f} "
        f"| {percentile(direct, 50):.2f} / {percentile(direct, 99):.2f} | {_cpu_ms(row):.2f} "
        f"| {g.cpu_s / g.elapsed_s:.2f} / {g.wait_s / g.elapsed_s:.2f} "
        f"| {row.neighbours_cpu[0]:.2f} / {row.neighbours_cpu[1]:.2f} "
        f"| {g.peak.rss_kib / 1024:.0f} | {per_session:.0f} | {g.peak.fds} |"
    )


def scale_report(args: argparse.Namespace, run: ScaleRun) -> str:
    rows = run.rows
    labels = [call_label(p, s) for p in args.providers for s in (False, True)]
    out = [
        f"Machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end, "
        f"Python {sys.version.split()[0]}; descriptor limit {run.nofile[0]} "
        f"(hard {run.nofile[1]}). Engine: {pacing(args)}. "
        f"Body: {body_sizes([args.scale_body])}. Every session cycles "
        f"through {len(labels)} kinds of call ({', '.join(labels)}).",
        f"Fresh gateway (one session, warmed): RSS {run.fresh_rss_kib / 1024:.0f} MiB, "
        f"{run.fresh_fds} fds, idle CPU {run.idle_cpu_ms_per_s:.2f} ms/s.",
        "",
        SCALE_HEADER,
        *(scale_summary_row(r, run.fresh_rss_kib) for r in rows),
        "",
        "Added latency per API (p50 / p99 ms, gateway minus direct):",
        "",
        "| API | " + " | ".join(f"{r.load.sessions} sessions" for r in rows) + " |",
        "|---|" + "---|" * len(rows),
    ]
    for label in labels:
        cells = [
            f"{_added(r, 50, label=label):.2f} / {_added(r, 99, label=label):.2f}" for r in rows
        ]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Streams: added time to first byte / to first content event (p50 ms; p99 in brackets):",
        "",
        "| API | " + " | ".join(f"{r.load.sessions} sessions" for r in rows) + " |",
        "|---|" + "---|" * len(rows),
    ]
    for provider in args.providers:
        label = call_label(provider, True)
        cells = [
            f"{_added(r, 50, 'first_byte_ms', label):.2f} ({_added(r, 99, 'first_byte_ms', label):.2f})"
            f" / {_added(r, 50, 'content_ms', label):.2f} ({_added(r, 99, 'content_ms', label):.2f})"
            for r in rows
        ]
        out.append(f"| {provider} | " + " | ".join(cells) + " |")
    direct_first = [
        f"{percentile(r.direct.by_label[call_label(args.providers[0], True)].first_byte_ms, 50):.2f}"
        for r in rows
    ]
    out += ["", f"Direct stream, first byte p50 ms: {', '.join(direct_first)}.", ""]
    out.append(nothing_lost(run))
    by_n = {r.load.sessions: r for r in rows}
    if 32 in by_n and max(by_n) >= 1000:
        top = by_n[max(by_n)]
        ratio = _cpu_ms(top) / _cpu_ms(by_n[32])
        out.append(
            f"Targets at {top.load.sessions} sessions: added p99 {_added(top, 99):.2f} ms "
            f"(target < 10); CPU per call {ratio:.2f}x the 32-session figure (target <= 1.5)."
        )
    return "\n".join(out)


def pacing(args: argparse.Namespace) -> str:
    if not args.engine_token_ms:
        return "every reply at once"
    return f"paced, a stream frame every {args.engine_token_ms:g} ms"


def nothing_lost(run: ScaleRun) -> str:
    """Every acknowledged call in the store, per session, and the store verifies clean."""
    if "sessions" not in run.verify:
        return f"Capture verify failed to run: {run.verify}"
    stored = {s["session_id"]: s["records"] for s in run.verify["sessions"]}
    acked = sum(run.acknowledged.values())
    short = [k for k, n in run.acknowledged.items() if stored.get(k, 0) < n]
    faults = len(run.verify["integrity"]) + sum(len(s["faults"]) for s in run.verify["sessions"])
    return (
        f"Nothing lost: {acked} calls acknowledged (200), {sum(stored.values())} records in the "
        f"store over {len(stored)} sessions; {len(short)} sessions with fewer records than "
        f"acknowledged calls; `polar capture verify`: {faults} faults."
    )


def parse_scale_load(text: str) -> ScaleLoad:
    sessions, think_ms, seconds = text.split(":")
    return ScaleLoad(int(sessions), float(think_ms) / 1000, float(seconds))


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
    p.add_argument(
        "--scale",
        action="store_true",
        help="only the 1-to-1,000 paced sessions run (--scale-loads), every API in one mix",
    )
    p.add_argument(
        "--scale-loads",
        default="1:100:30,32:10000:120,256:10000:60,1000:10000:90",
        help="SESSIONS:THINK_MS:SECONDS, comma-separated, ascending",
    )
    p.add_argument("--scale-body", default="pi", help="the body every scale call carries")
    p.add_argument(
        "--direct-share", type=float, default=0.5, help="direct cell length / gateway cell's"
    )
    p.add_argument("--scale-idle-s", type=float, default=3.0, help="idle gateway CPU window")
    p.add_argument(
        "--engine-token-ms",
        type=float,
        default=0.0,
        help="scale runs: the fake engine paces replies as generated (a frame every N ms)",
    )
    args = p.parse_args(argv)
    args.admin_token = secrets.token_urlsafe(24)
    if args.smoke:
        args.concurrency, args.paced, args.bodies, args.litellm = "2", "2:50", "pi", False
        args.min_requests, args.per_session, args.max_seconds = 4, 1, 2.0
        args.paced_seconds, args.warmup = 0.5, 1
        args.scale_loads, args.direct_share, args.scale_idle_s = "2:50:1", 1.0, 0.2
    elif args.quick:
        args.concurrency, args.paced = "1,32", "32:1000"
        args.min_requests, args.per_session, args.max_seconds = 50, 1, 4.0
        args.paced_seconds, args.warmup = 2.0, 10
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    args.paced = [parse_load(x) for x in args.paced.split(",") if x]
    args.scale_loads = [parse_scale_load(x) for x in args.scale_loads.split(",") if x]
    args.providers = args.providers.split(",")
    args.bodies = args.bodies.split(",")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="polar-gw-bench-"))
    try:
        raise_descriptor_limit()  # 1,000 sessions hold 1,000 client sockets here
        if not args.scale:
            cases = build_cases(args.bodies, args.providers)
            print(asyncio.run(measure(args, cases, work)))
        if args.scale or args.smoke:
            cases = build_cases([args.scale_body], args.providers)
            print(scale_report(args, asyncio.run(scale_measure(args, cases, work))))
    finally:
        if args.keep:
            print(f"work dir kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
