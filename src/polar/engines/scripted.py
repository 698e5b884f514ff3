"""A scripted OpenAI-compatible engine for tests and demos, token-real and vLLM-shaped.

It answers from a script (text, tool calls, reasoning, finish reasons, or an HTTP error) but
computes prompt ids with a REAL tokenizer and chat template and sampled ids by tokenizing the
reply exactly as a model would emit it, so everything downstream (capture, prefix merging)
sees the same token structure a real engine produces.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from polar.engines.model_files import SMOLLM2_MODEL_NAME, load_tokenizer
from polar.engines.tool_text import assistant_text, messages_for_plain_template
from polar.engines.vllm import VLLMEngine


@dataclass
class ScriptedReply:
    """One scripted answer. ``tool_calls`` are ``(name, arguments)`` pairs."""

    content: str = ""
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    reasoning: str | None = None
    finish_reason: str | None = None
    error_status: int | None = None
    error_message: str = "scripted engine error"
    delay_s: float = 0.0


class Script:
    """A queue of replies, thread-safe; ``default`` answers when the queue is empty."""

    def __init__(
        self, replies: list[ScriptedReply] | None = None, default: ScriptedReply | None = None
    ):
        self._queue: deque[ScriptedReply] = deque(replies or [])
        self.default = default or ScriptedReply(content="Done.")
        self._lock = threading.Lock()

    def push(self, *replies: ScriptedReply) -> None:
        with self._lock:
            self._queue.extend(replies)

    def next(self) -> ScriptedReply:
        with self._lock:
            return self._queue.popleft() if self._queue else self.default


def logprob_for(position: int, token_id: int) -> float:
    """A deterministic, token-dependent fake logprob (real values come from real engines)."""
    return -((token_id * 7 + position * 13) % 97) / 40.0 - 0.01


class ScriptedBackend:
    """Turns chat-completions bodies into vLLM-shaped replies following a :class:`Script`."""

    def __init__(
        self,
        script: Script | None = None,
        tokenizer: Any = None,
        model_name: str = SMOLLM2_MODEL_NAME,
        max_model_len: int = 8192,
    ) -> None:
        self.script = script or Script()
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer()
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.eot_id = int(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.log: list[dict[str, Any]] = []

    def prompt_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        rendered = messages_for_plain_template(messages, tools)
        ids = self.tokenizer.apply_chat_template(
            rendered, add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def respond(self, body: dict[str, Any], reply: ScriptedReply) -> dict[str, Any]:
        messages = body.get("messages") or []
        tools = body.get("tools") or None
        prompt = self.prompt_ids(messages, tools)
        calls = [
            {
                "id": "call_" + uuid.uuid4().hex[:24],
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
            for name, args in reply.tool_calls
        ]
        finish = reply.finish_reason or ("tool_calls" if calls else "stop")
        text = assistant_text(reply.content, calls)
        if reply.reasoning:
            text = f"<think>\n{reply.reasoning}\n</think>\n" + text
        sampled = [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        if isinstance(max_tokens, int) and len(sampled) >= max_tokens:
            sampled, finish = sampled[:max_tokens], "length"
        elif finish != "length":
            sampled.append(self.eot_id)
        entries = [
            {
                "token": self.tokenizer.convert_ids_to_tokens(t),
                "logprob": logprob_for(i, t),
                "bytes": None,
                "top_logprobs": [],
            }
            for i, t in enumerate(sampled)
        ]
        reply_body = {
            "id": "chatcmpl-" + uuid.uuid4().hex[:24],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model_name,
            "prompt_token_ids": prompt,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": reply.content or None,
                        "reasoning_content": reply.reasoning,
                        "tool_calls": calls,
                    },
                    "finish_reason": finish,
                    "token_ids": sampled,
                    "logprobs": {"content": entries},
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(sampled),
                "total_tokens": len(prompt) + len(sampled),
            },
        }
        self.log.append(reply_body)
        return reply_body


def create_scripted_app(backend: ScriptedBackend) -> Starlette:
    """The OpenAI-compatible ASGI app: chat completions, tokenize, models, health."""

    async def chat(request: Request) -> Response:
        body = await request.json()
        reply = backend.script.next()
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.error_status:
            return JSONResponse(
                {
                    "error": {
                        "message": reply.error_message,
                        "type": "BadRequestError",
                        "code": reply.error_status,
                    }
                },
                status_code=reply.error_status,
            )
        return JSONResponse(await run_in_threadpool(backend.respond, body, reply))

    async def tokenize(request: Request) -> Response:
        body = await request.json()
        if "messages" in body:
            ids = await run_in_threadpool(backend.prompt_ids, body["messages"], body.get("tools"))
        else:
            ids = backend.tokenizer.encode(body.get("prompt", ""), add_special_tokens=False)
        return JSONResponse(
            {"count": len(ids), "tokens": ids, "max_model_len": backend.max_model_len}
        )

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": backend.model_name,
                        "object": "model",
                        "max_model_len": backend.max_model_len,
                    }
                ],
            }
        )

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ]
    )


class ScriptedEngine(VLLMEngine):
    """The scripted backend served in-process and called exactly like a vLLM server."""

    name: ClassVar[str] = "scripted"

    def __init__(self, backend: ScriptedBackend, *, timeout_s: float = 60.0) -> None:
        self.backend = backend
        transport = httpx.ASGITransport(app=create_scripted_app(backend))
        super().__init__("http://scripted-engine", transport=transport, timeout_s=timeout_s)

    @classmethod
    def from_options(cls, options: dict[str, Any], *, timeout_s: float = 60.0) -> ScriptedEngine:
        """Options: ``tokenizer`` (path; default SmolLM2), ``default_reply`` (text)."""
        script = Script(default=ScriptedReply(content=str(options.get("default_reply", "Done."))))
        backend = ScriptedBackend(script, tokenizer=load_tokenizer(options.get("tokenizer")))
        return cls(backend, timeout_s=timeout_s)
