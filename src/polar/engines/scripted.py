"""A scripted OpenAI-compatible engine for tests and demos, token-real and vLLM-shaped.

It answers from a script (:mod:`polar.engines.scripted_script`: text, tool calls, reasoning,
finish reasons, or an HTTP error) through a backend that renders and tokenizes for real
(:mod:`polar.engines.scripted_backend`). This module serves it over HTTP: chat completions
(engine-side rendering) and token prompts on ``/v1/completions`` (gateway-side rendering),
in process, called exactly like a vLLM server.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import httpx
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from polar.engines.scripted_backend import ScriptedBackend, has_image, logprob_for
from polar.engines.scripted_script import ConversationScript, Script, ScriptedReply
from polar.engines.vllm import VLLMEngine
from polar.errors import EngineRefusal
from polar.rendering.model_files import load_tokenizer

__all__ = [
    "ConversationScript",
    "Script",
    "ScriptedBackend",
    "ScriptedEngine",
    "ScriptedReply",
    "create_scripted_app",
    "logged_tokens",
    "logprob_for",
]


def create_scripted_app(backend: ScriptedBackend) -> Starlette:
    """The OpenAI-compatible ASGI app: chat and token completions, tokenize, models, health."""

    def refusal(status: int, message: str) -> Response:
        return JSONResponse(
            {"error": {"message": message, "type": "BadRequestError", "code": status}},
            status_code=status,
        )

    async def answer(request: Request, respond: Any) -> Response:
        body = await request.json()
        backend.requests.append(body)
        script = backend.script
        if script.needs_conversation:
            conversation, turn = await run_in_threadpool(backend.conversation, body)
            reply = script.choose(conversation, turn)
        else:
            reply = script.next()
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.error_status:
            return refusal(reply.error_status, reply.error_message)
        try:
            return JSONResponse(await run_in_threadpool(respond, body, reply))
        except EngineRefusal as exc:
            return refusal(exc.status, exc.message)

    async def chat(request: Request) -> Response:
        return await answer(request, backend.respond)

    async def completions(request: Request) -> Response:
        return await answer(request, backend.respond_tokens)

    async def tokenize(request: Request) -> Response:
        body = await request.json()
        try:
            backend.check_model(body)
        except EngineRefusal as exc:
            return refusal(exc.status, exc.message)
        messages = body.get("messages")
        if isinstance(messages, list) and not backend.multimodal and any(map(has_image, messages)):
            return refusal(400, f"{backend.model_name} is not a multimodal model")
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
            Route("/v1/completions", completions, methods=["POST"]),
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

    def local_tokenizer(self) -> Any:
        return self.backend.tokenizer

    @classmethod
    def from_options(cls, options: dict[str, Any], *, timeout_s: float = 60.0) -> ScriptedEngine:
        """Options: ``tokenizer`` (path; default SmolLM2), ``default_reply`` (text),
        ``noncanonical`` (sample as real models do; see :mod:`polar.engines.scripted_backend`)."""
        script = Script(default=ScriptedReply(content=str(options.get("default_reply", "Done."))))
        backend = ScriptedBackend(
            script,
            tokenizer=load_tokenizer(options.get("tokenizer")),
            noncanonical=bool(options.get("noncanonical", False)),
        )
        return cls(backend, timeout_s=timeout_s)


def logged_tokens(reply: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids, sampled ids, logprobs) of a reply in :attr:`ScriptedBackend.log`, as the
    engine sent them: a chat completion (engine-side rendering) or a token-prompt completion
    (gateway-side rendering), both in vLLM's shape."""
    choice = reply["choices"][0]
    if reply.get("object") == "text_completion":
        return choice["prompt_token_ids"], choice["token_ids"], choice["logprobs"]["token_logprobs"]
    logprobs = [e["logprob"] for e in choice["logprobs"]["content"]]
    return reply["prompt_token_ids"], choice["token_ids"], logprobs
