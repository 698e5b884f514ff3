"""``polar demo``: the gateway in standalone capture mode, end to end, in one command.

It starts a gateway on a free loopback port in front of the scripted engine (real SmolLM2
tokenizer and chat template), sends a two-turn tool-calling conversation through each of the
four provider APIs (streaming and not), and shows that every captured token equals what the
engine produced. Records are written as JSONL for inspection.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from polar.capture.store import CaptureStore
from polar.engines.scripted import ScriptedEngine, logged_tokens
from polar.engines.scripted_backend import ScriptedBackend
from polar.engines.scripted_script import Script, ScriptedReply
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.listen import bind_gateway
from polar.gateway.server import BackgroundServer
from polar.tokens import new_token

TOOL = {
    "name": "shell",
    "description": "Run a shell command",
    "schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
TASK = "Create hello.txt containing 'hi'."


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="standalone capture demo: four provider APIs through the gateway, tokens checked",
    )
    p.add_argument("--out", default=None, help="directory for the capture DB and records JSONL")
    p.set_defaults(func=run)


def _requests(stream: bool) -> dict[str, tuple[str, dict[str, Any], dict[str, Any]]]:
    """Per provider: (path, first-turn body, follow-up body with the tool result)."""
    return {
        "openai_chat": (
            "/v1/chat/completions",
            {
                "model": "any",
                "stream": stream,
                "messages": [{"role": "user", "content": TASK}],
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": TOOL["name"],
                            "description": TOOL["description"],
                            "parameters": TOOL["schema"],
                        },
                    }
                ],
            },
            {"role": "tool", "content": "exit 0"},
        ),
        "openai_responses": (
            "/v1/responses",
            {
                "model": "any",
                "stream": stream,
                "input": TASK,
                "tools": [
                    {
                        "type": "function",
                        "name": TOOL["name"],
                        "description": TOOL["description"],
                        "parameters": TOOL["schema"],
                    }
                ],
            },
            {"type": "function_call_output", "output": "exit 0"},
        ),
        "anthropic": (
            "/v1/messages",
            {
                "model": "any",
                "max_tokens": 256,
                "stream": stream,
                "messages": [{"role": "user", "content": TASK}],
                "tools": [
                    {
                        "name": TOOL["name"],
                        "description": TOOL["description"],
                        "input_schema": TOOL["schema"],
                    }
                ],
            },
            {"type": "tool_result", "content": "exit 0"},
        ),
        "google": (
            "/v1beta/models/any:" + ("streamGenerateContent" if stream else "generateContent"),
            {
                "contents": [{"role": "user", "parts": [{"text": TASK}]}],
                "tools": [
                    {
                        "functionDeclarations": [
                            {
                                "name": TOOL["name"],
                                "description": TOOL["description"],
                                "parametersJsonSchema": TOOL["schema"],
                            }
                        ]
                    }
                ],
            },
            {"functionResponse": {"name": TOOL["name"], "response": {"output": "exit 0"}}},
        ),
    }


def _last_event_json(text: str) -> list[Any]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def _follow_up(
    provider: str,
    first: dict[str, Any],
    reply: httpx.Response,
    result: dict[str, Any],
    stream: bool,
) -> dict[str, Any]:
    """The second-turn body: history + the assistant's tool call + the tool result."""
    body = json.loads(json.dumps(first))
    events = _last_event_json(reply.text) if stream else [reply.json()]
    if provider == "openai_chat":
        calls = [
            c
            for e in events
            for ch in e.get("choices", [])
            for c in (ch.get("delta") or ch.get("message") or {}).get("tool_calls") or []
        ]
        body["messages"] += [
            {"role": "assistant", "content": None, "tool_calls": calls},
            result | {"tool_call_id": calls[0]["id"]},
        ]
    elif provider == "openai_responses":
        final = (
            next(e["response"] for e in events if e.get("type") == "response.completed")
            if stream
            else events[0]
        )
        items = [o for o in final["output"] if o["type"] == "function_call"]
        body["input"] = [
            {"role": "user", "content": TASK},
            *items,
            result | {"call_id": items[0]["call_id"]},
        ]
    elif provider == "anthropic":
        blocks = (
            [e["content_block"] for e in events if e.get("type") == "content_block_start"]
            if stream
            else events[0]["content"]
        )
        if stream:
            for b in blocks:
                if b["type"] == "tool_use":
                    b["input"] = {"command": "echo hi > hello.txt"}
        body["messages"] += [
            {"role": "assistant", "content": blocks},
            {"role": "user", "content": [result | {"tool_use_id": blocks[-1]["id"]}]},
        ]
    else:
        parts = [p for e in events for c in e.get("candidates", []) for p in c["content"]["parts"]]
        body["contents"] += [{"role": "model", "parts": parts}, {"role": "user", "parts": [result]}]
    return body


def run(args: argparse.Namespace) -> int:
    console = Console(width=max(Console().width, 110))
    out = Path(args.out or tempfile.mkdtemp(prefix="polar-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    console.print(
        "[bold]Polar standalone capture demo[/] (scripted engine, real SmolLM2 tokenizer)"
    )
    started = time.perf_counter()
    backend = ScriptedBackend(Script())
    engine = ScriptedEngine(backend)
    token = new_token()  # the demo's own admin token: it creates sessions with it
    config = GatewayConfig(
        port=0,
        capture_db=out / "captures.db",
        served_model="SmolLM2-135M-Instruct",
        admin_token=token,
    )
    config, sock = bind_gateway(config)  # the port is known before sessions hand out URLs
    store = CaptureStore(config.capture_db)
    table = Table(title="Captured calls (every token compared with the engine's reply)")
    for col in (
        "provider",
        "stream",
        "turn",
        "prompt ids",
        "sampled ids",
        "logprobs",
        "finish",
        "faithful",
    ):
        table.add_column(
            col, justify="right" if col in ("prompt ids", "sampled ids", "logprobs") else "left"
        )
    all_ok = True
    with (
        BackgroundServer(create_app(config, engine=engine, store=store), sock=sock) as server,
        httpx.Client(timeout=60, headers={"authorization": f"Bearer {token}"}) as client,
    ):
        console.print(f"gateway: {server.url}  capture store: {config.capture_db}")
        for stream in (False, True):
            for provider, (path, first, result) in _requests(stream).items():
                session = client.post(
                    f"{server.url}/polar/sessions", json={"metadata": {"demo": provider}}
                ).json()
                url = session["base_urls"]["google" if provider == "google" else "anthropic"] + path
                if provider == "google" and stream:
                    url += "?alt=sse"
                backend.script.push(
                    ScriptedReply(
                        content="I'll create the file.",
                        tool_calls=[("shell", {"command": "echo hi > hello.txt"})],
                    ),
                    ScriptedReply(content="Created hello.txt."),
                )
                reply = client.post(url, json=first)
                reply.raise_for_status()
                second = client.post(url, json=_follow_up(provider, first, reply, result, stream))
                second.raise_for_status()
                records = store.records(session["session_id"])
                for turn, (record, engine_reply) in enumerate(
                    zip(records, backend.log[-2:], strict=True), 1
                ):
                    prompt_ids, sampled_ids, logprobs = logged_tokens(engine_reply)
                    ok = (
                        record.prompt_ids == prompt_ids
                        and record.sampled_ids == sampled_ids
                        and record.logprobs == logprobs
                    )
                    all_ok &= ok
                    table.add_row(
                        provider,
                        str(stream),
                        str(turn),
                        str(len(record.prompt_ids)),
                        str(len(record.sampled_ids)),
                        str(len(record.logprobs or [])),
                        record.finish_reason,
                        "[green]yes[/]" if ok else "[red]NO[/]",
                    )
                with (out / "records.jsonl").open("a") as f:
                    for record in records:
                        f.write(record.model_dump_json() + "\n")
    store.close()
    console.print(table)
    console.print(
        f"records: {out / 'records.jsonl'}   wall time: {time.perf_counter() - started:.1f} s"
    )
    console.print("[green]all captures token-faithful[/]" if all_ok else "[red]capture mismatch[/]")
    return 0 if all_ok else 1
