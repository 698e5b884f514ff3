"""Responses over WebSocket vs HTTP through the gateway: per-call latency and session wall time.

One gateway (gateway-side rendering, every record committed before its reply leaves) in front of
the scripted engine (token-real: SmolLM2's tokenizer, no model), and tool-loop sessions as Codex
drives them: every reply is a tool call, every next turn adds its output. Three transports, the
same sessions and replies:

* ``http-full``: a streamed ``POST /v1/responses`` per turn with the whole history and
  ``store: false`` (what Codex sends over HTTP);
* ``http-previous``: a streamed POST per turn with only the new input and
  ``previous_response_id``;
* ``websocket``: one socket per session, a ``response.create`` frame per turn with only the new
  input, ``previous_response_id`` and ``store: false`` (what Codex sends with
  ``supports_websockets``).

Per call: from the request leaving to ``response.completed`` arriving (p50, p90); per session:
the wall time of all its turns (connection set-up included) and the bytes the client sent. The
engine is the same in every cell, so the differences are the transport's. Client and gateway
share this process (the gateway in a thread), as in the tests.

    python bench/responses_websocket.py                 # 6 sessions x 20 turns per transport
    python bench/responses_websocket.py --smoke         # 1 session x 3 turns (CI)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import connect

from polar.capture.store import CaptureStore
from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine, ScriptedReply
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.server import BackgroundServer
from polar.rendering.model_files import load_tokenizer

TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "description": "Run a command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        },
    }
]
# Instructions of a coding agent's size (Codex's own are ~17 KB; the compact preset's far less).
INSTRUCTIONS = "You are a coding agent. Use the tools to work on files.\n" * 60
OUTPUT = "file_%d.txt\n" * 20
TRANSPORTS = ("http-full", "http-previous", "websocket")


@dataclass
class Cell:
    transport: str
    calls_ms: list[float] = field(default_factory=list)
    sessions_s: list[float] = field(default_factory=list)
    sent_bytes: list[int] = field(default_factory=list)


def run_session(base_url: str, key: str, transport: str, turns: int, cell: Cell) -> None:
    started = time.perf_counter()
    sent = 0
    history: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "list files"}]
    new: list[dict[str, Any]] = list(history)
    previous: str | None = None
    auth = {"Authorization": f"Bearer {key}"}
    common = {"model": "gpt-5-codex", "instructions": INSTRUCTIONS, "tools": TOOLS}
    with contextlib.ExitStack() as stack:
        http = stack.enter_context(httpx.Client(base_url=base_url, headers=auth, timeout=60))
        socket = None
        if transport == "websocket":
            url = base_url.replace("http://", "ws://", 1) + "/v1/responses"
            socket = stack.enter_context(connect(url, additional_headers=auth, max_size=None))
        for number in range(turns):
            if transport == "http-full":
                body = {**common, "input": history, "store": False}
            else:
                body = {**common, "input": new, "previous_response_id": previous}
                if transport == "websocket":
                    body["store"] = False
            began = time.perf_counter()
            if socket is not None:
                frame = json.dumps({"type": "response.create", **body})
                sent += len(frame)
                socket.send(frame)
                response = _socket_completed(socket)
            else:
                payload = json.dumps({**body, "stream": True})
                sent += len(payload)
                response = _sse_completed(http, payload)
            cell.calls_ms.append((time.perf_counter() - began) * 1000)
            previous = response["id"]
            call = next(o for o in response["output"] if o["type"] == "function_call")
            result = {
                "type": "function_call_output",
                "call_id": call["call_id"],
                "output": OUTPUT % ((number,) * 20),
            }
            history += [*response["output"], result]
            new = [result]
    cell.sessions_s.append(time.perf_counter() - started)
    cell.sent_bytes.append(sent)


def _socket_completed(socket: Any) -> dict[str, Any]:
    while True:
        event = json.loads(socket.recv(timeout=60))
        if event["type"] == "response.completed":
            return event["response"]  # type: ignore[no-any-return]
        if event["type"] in ("error", "response.failed"):
            raise RuntimeError(f"the gateway answered {event}")


def _sse_completed(http: httpx.Client, payload: str) -> dict[str, Any]:
    headers = {"content-type": "application/json"}
    with http.stream("POST", "/v1/responses", content=payload, headers=headers) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"the gateway answered {reply.status_code}: {reply.read()!r}")
        for line in reply.iter_lines():
            if line.startswith("data: ") and '"response.completed"' in line[:40]:
                return json.loads(line[6:])["response"]  # type: ignore[no-any-return]
    raise RuntimeError("the stream ended before response.completed")


def measure(sessions: int, turns: int, workdir: Path) -> list[Cell]:
    backend = ScriptedBackend(
        Script(default=ScriptedReply(tool_calls=[("shell", {"command": ["ls"]})])),
        tokenizer=load_tokenizer(),
        max_model_len=131072,
    )
    config = GatewayConfig(
        capture_db=workdir / "captures.db", auto_register=True, render={"tool_parser": "qwen3"}
    )
    store = CaptureStore(config.capture_db)
    app = create_app(config, engine=ScriptedEngine(backend), store=store)
    cells = [Cell(t) for t in TRANSPORTS]
    with BackgroundServer(app) as server:
        run_session(server.url, "bench-warm-0", "http-full", 2, Cell("warm"))  # first-call costs
        for index in range(sessions):
            for cell in cells:  # interleaved, so drift on a shared machine hits all alike
                key = f"bench-{cell.transport}-{index}"
                run_session(server.url, key, cell.transport, turns, cell)
        for cell in cells:
            for index in range(sessions):
                records = store.records(f"bench-{cell.transport}-{index}")
                assert len(records) == turns, (cell.transport, len(records))
    store.close()
    return cells


def report(cells: list[Cell], sessions: int, turns: int) -> str:
    lines = [
        f"{sessions} sessions x {turns} turns per transport (scripted engine, gateway rendering)",
        "",
        "| transport | call p50 ms | call p90 ms | session wall s (mean) | client bytes/session |",
        "|---|---|---|---|---|",
    ]
    for cell in cells:
        calls = sorted(cell.calls_ms)
        p90 = calls[min(len(calls) - 1, int(0.9 * len(calls)))]
        lines.append(
            f"| {cell.transport} | {statistics.median(calls):.1f} | {p90:.1f} | "
            f"{statistics.mean(cell.sessions_s):.2f} | {int(statistics.mean(cell.sent_bytes)):,} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="1 session x 3 turns (CI)")
    args = parser.parse_args()
    sessions, turns = (1, 3) if args.smoke else (args.sessions, args.turns)
    with tempfile.TemporaryDirectory() as tmp:
        cells = measure(sessions, turns, Path(tmp))
    print(report(cells, sessions, turns))


if __name__ == "__main__":
    main()
