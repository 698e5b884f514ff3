"""The standalone capture demo ``polar demo`` runs: a gateway in front of the scripted engine,
every provider API through it, every captured token compared with the engine's reply.

:class:`DemoGateway` is the gateway, built by hand on a free loopback port: the scripted engine
(real SmolLM2 tokenizer and chat template), an admin token of its own that opens the sessions,
and a capture store under the demo's directory. :meth:`DemoGateway.converse` sends a two-turn
tool-calling conversation through each of the four provider APIs (streaming and not), writes the
records as JSONL beside the store, and returns one :class:`CapturedCall` per engine call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

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


@dataclass(frozen=True)
class CapturedCall:
    """One engine call of the demo as captured: sizes, finish, and whether every prompt id,
    sampled id and logprob equals what the engine produced."""

    provider: str
    stream: bool
    turn: int
    prompt_ids: int
    sampled_ids: int
    logprobs: int
    finish_reason: str
    faithful: bool


class DemoGateway:
    """The demo's gateway: serving from :meth:`__enter__` until :meth:`__exit__`, which also
    closes its capture store. The port is bound at construction, so session URLs are known."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.backend = ScriptedBackend(Script())
        engine = ScriptedEngine(self.backend)
        self.token = new_token()  # the demo's own admin token: it creates sessions with it
        config = GatewayConfig(
            port=0,
            capture_db=out / "captures.db",
            served_model="SmolLM2-135M-Instruct",
            admin_token=self.token,
        )
        config, sock = bind_gateway(config)  # the port is known before sessions hand out URLs
        self.capture_db = config.capture_db
        self.store = CaptureStore(config.capture_db)
        self._server = BackgroundServer(
            create_app(config, engine=engine, store=self.store), sock=sock
        )

    @property
    def url(self) -> str:
        return self._server.url

    def __enter__(self) -> DemoGateway:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()
        self.store.close()

    def converse(self) -> list[CapturedCall]:
        """Both turns of the conversation through every provider, not streamed then streamed;
        the records are appended to ``records.jsonl`` in the demo's directory."""
        calls = []
        with httpx.Client(timeout=60, headers={"authorization": f"Bearer {self.token}"}) as client:
            for stream in (False, True):
                for provider, (path, first, result) in _requests(stream).items():
                    calls += self._converse_once(client, provider, stream, path, first, result)
        return calls

    def _converse_once(
        self,
        client: httpx.Client,
        provider: str,
        stream: bool,
        path: str,
        first: dict[str, Any],
        result: dict[str, Any],
    ) -> list[CapturedCall]:
        session = client.post(
            f"{self.url}/polar/sessions", json={"metadata": {"demo": provider}}
        ).json()
        url = session["base_urls"]["google" if provider == "google" else "anthropic"] + path
        if provider == "google" and stream:
            url += "?alt=sse"
        self.backend.script.push(
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
        records = self.store.records(session["session_id"])
        calls = []
        for turn, (record, engine_reply) in enumerate(
            zip(records, self.backend.log[-2:], strict=True), 1
        ):
            prompt_ids, sampled_ids, logprobs = logged_tokens(engine_reply)
            calls.append(
                CapturedCall(
                    provider=provider,
                    stream=stream,
                    turn=turn,
                    prompt_ids=len(record.prompt_ids),
                    sampled_ids=len(record.sampled_ids),
                    logprobs=len(record.logprobs or []),
                    finish_reason=record.finish_reason,
                    faithful=(
                        record.prompt_ids == prompt_ids
                        and record.sampled_ids == sampled_ids
                        and record.logprobs == logprobs
                    ),
                )
            )
        with (self.out / "records.jsonl").open("a") as f:
            for record in records:
                f.write(record.model_dump_json() + "\n")
        return calls


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
