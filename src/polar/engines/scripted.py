"""A scripted OpenAI-compatible engine for tests and demos, token-real and vLLM-shaped.

It answers from a script (text, tool calls, reasoning, finish reasons, or an HTTP error) but
computes prompt ids with a REAL tokenizer and chat template and sampled ids by tokenizing the
reply exactly as a model would emit it, so everything downstream (capture, prefix merging)
sees the same token structure a real engine produces. It is as strict as vLLM: an unknown
model name is a 404, a prompt over the context window a 400 (an output budget that does not
fit is lowered, as vLLM does). It serves chat completions (engine-side rendering) and token
prompts on ``/v1/completions`` (gateway-side rendering).

``noncanonical=True`` samples the way real models do and templates do not re-render: tool-call
JSON pretty-printed, and text in a tokenization that re-encoding does not reproduce. With
engine-side rendering the next prompt then differs from what was sampled (drift), exactly the
defect a canonical fake hides.
"""

from __future__ import annotations

import asyncio
import json
import re
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
from polar.engines.types import usage_body
from polar.engines.vllm import VLLMEngine
from polar.errors import EngineRefusal
from polar.rendering.parsers.think import split_think
from polar.rendering.tool_text import assistant_text, messages_for_plain_template


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

    needs_conversation: ClassVar[bool] = False
    """Whether :meth:`choose` reads the conversation (the engine then works it out)."""

    def choose(self, conversation: str, turn: int) -> ScriptedReply:
        """The reply to one request; a plain script ignores what was asked and pops its queue."""
        return self.next()


class ConversationScript(Script):
    """Replies chosen by the conversation itself, so concurrent sessions each follow their own
    script: the first rule whose marker occurs in the conversation's text, at the index of the
    assistant turns taken so far (past its end, ``default``). A conversation no marker matches
    takes the queue, then ``default``."""

    needs_conversation: ClassVar[bool] = True

    def __init__(
        self,
        rules: dict[str, list[ScriptedReply]],
        default: ScriptedReply | None = None,
        replies: list[ScriptedReply] | None = None,
    ) -> None:
        super().__init__(replies, default)
        self.rules = {marker: list(steps) for marker, steps in rules.items()}

    def choose(self, conversation: str, turn: int) -> ScriptedReply:
        for marker, steps in self.rules.items():
            if marker in conversation:
                return steps[turn] if turn < len(steps) else self.default
        return self.next()


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
        *,
        noncanonical: bool = False,
        multimodal: bool = False,
    ) -> None:
        self.script = script or Script()
        # A text-only model refuses image parts as vLLM does; a multimodal one takes them.
        self.multimodal = multimodal
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer()
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.noncanonical = noncanonical
        self.eot_id = int(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.log: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []  # every body it received, as received

    def prompt_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        continue_final: bool = False,
    ) -> list[int]:
        rendered = messages_for_plain_template([_image_tokens(m) for m in messages], tools)
        ids = self.tokenizer.apply_chat_template(
            rendered,
            add_generation_prompt=not continue_final,
            continue_final_message=continue_final,
            tokenize=True,
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def conversation(self, body: dict[str, Any]) -> tuple[str, int]:
        """A request's conversation as text, and the assistant turns it already holds."""
        messages = body.get("messages")
        if isinstance(messages, list):
            text = "\n".join(_message_text(m) for m in messages if isinstance(m, dict))
            turns = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
            return text, turns
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return "", 0
        text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        # The rendered prompt ends with the generation prompt: one assistant header more than
        # the turns already taken.
        return text, max(text.count("<|im_start|>assistant") - 1, 0)

    def check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise EngineRefusal(404, f"The model `{model}` does not exist.")

    def room(self, prompt: list[int], body: dict[str, Any]) -> int:
        """The output budget vLLM would grant, or a refusal in its words."""
        if len(prompt) >= self.max_model_len:
            raise EngineRefusal(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your request has {len(prompt)} input tokens. Please reduce the length of the "
                "input messages.",
            )
        asked = body.get("max_tokens") or body.get("max_completion_tokens")
        if isinstance(asked, int) and asked > self.max_model_len:
            raise EngineRefusal(
                400,
                f"max_tokens={asked} cannot be greater than max_model_len={self.max_model_len}.",
            )
        room = self.max_model_len - len(prompt)
        return min(asked, room) if isinstance(asked, int) else room

    def sample(
        self, reply: ScriptedReply, max_tokens: int, stops: list[str] | None = None
    ) -> tuple[list[int], str, list, str | None]:
        """The ids a model emits for ``reply``, the finish reason, the structured calls, and
        the stop string that ended it (vLLM stops there; the ids run through the stop)."""
        calls = [
            {
                "id": "call_" + uuid.uuid4().hex[:24],
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
            for name, args in reply.tool_calls
        ]
        finish = reply.finish_reason or ("tool_calls" if calls else "stop")
        if self.noncanonical:
            rendered = [
                "<tool_call>\n"
                + json.dumps({"name": n, "arguments": a}, ensure_ascii=False, indent=4)
                + "\n</tool_call>"
                for n, a in reply.tool_calls
            ]
            text = "\n".join([reply.content, *rendered] if reply.content else rendered)
        else:
            text = assistant_text(reply.content, calls)
        if reply.reasoning:
            text = f"<think>\n{reply.reasoning}\n</think>\n" + text
        hits = sorted((text.find(s), s) for s in stops or [] if s and s in text)
        stop = hits[0][1] if hits else None
        if stop is not None:
            text, calls, finish = text[: hits[0][0] + len(stop)], [], "stop"
        sampled = self._encode(text)
        if len(sampled) >= max_tokens:
            sampled, finish, stop = sampled[:max_tokens], "length", None
        elif finish != "length" and stop is None:
            sampled.append(self.eot_id)
        return sampled, finish, calls, stop

    def _encode(self, text: str) -> list[int]:
        if not self.noncanonical or len(text) < 2:
            return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]
        # Two halves tokenized apart: the same text, ids that re-encoding does not give back.
        half = len(text) // 2
        return [
            int(t)
            for piece in (text[:half], text[half:])
            for t in self.tokenizer.encode(piece, add_special_tokens=False)
        ]

    def logprob_entries(self, sampled: list[int]) -> list[dict[str, Any]]:
        return [
            {
                "token": self.tokenizer.convert_ids_to_tokens(t),
                "logprob": logprob_for(i, t),
                "bytes": None,
                "top_logprobs": [],
            }
            for i, t in enumerate(sampled)
        ]

    def run_to_stop(
        self,
        sampled: list[int],
        finish: str,
        stop: str | int | None,
        body: dict[str, Any],
        room: int,
    ) -> tuple[list[int], str, str | int | None]:
        """The ids as a real engine emits them on the token path: it stops only at the model's
        eos or a ``stop_token_ids`` entry (kept, vLLM's ``stop_reason`` is the id), so a turn
        ended by any other token runs on, the model writing its turn again, to the budget."""
        eos = self.tokenizer.eos_token_id
        asked = {t for t in body.get("stop_token_ids") or [] if isinstance(t, int)}
        for i, token in enumerate(sampled):
            if token == eos or token in asked:
                return sampled[: i + 1], "stop", token if token != eos else None
        if finish == "length" or stop is not None or not sampled:
            return sampled, finish, stop
        run_on = (sampled * (room // len(sampled) + 1))[:room]
        return run_on, "length", None

    def respond_tokens(self, body: dict[str, Any], reply: ScriptedReply) -> dict[str, Any]:
        """``/v1/completions`` with a token prompt, shaped like vLLM's ``return_token_ids``."""
        self.check_model(body)
        _check_structured_output(_token_schema(body), reply)
        pattern = _token_regex(body)
        prompt = body.get("prompt")
        vocab = len(self.tokenizer)
        if (
            not isinstance(prompt, list)
            or not prompt
            or not all(isinstance(t, int) and 0 <= t < vocab for t in prompt)
        ):
            raise EngineRefusal(400, "prompt must be a non-empty list of token ids")
        room = self.room(prompt, body)
        sampled, finish, _, stop_string = self.sample(reply, room, _stops(body))
        sampled, finish, stop = self.run_to_stop(sampled, finish, stop_string, body, room)
        if pattern is not None and finish != "length":
            _check_regex(pattern, self.tokenizer.decode(sampled, skip_special_tokens=True))
        entries = self.logprob_entries(sampled)
        reply_body = {
            "id": "cmpl-" + uuid.uuid4().hex[:24],
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "text": self.tokenizer.decode(sampled, skip_special_tokens=True),
                    "logprobs": {
                        "tokens": [e["token"] for e in entries],
                        "token_logprobs": [e["logprob"] for e in entries],
                        "top_logprobs": None,
                        "text_offset": None,
                    },
                    "finish_reason": "length" if finish == "length" else "stop",
                    "stop_reason": stop,
                    "prompt_token_ids": list(prompt),
                    "token_ids": sampled,
                }
            ],
            "usage": usage_body(len(prompt), len(sampled)),
        }
        self.log.append(reply_body)
        return reply_body

    def respond(self, body: dict[str, Any], reply: ScriptedReply) -> dict[str, Any]:
        self.check_model(body)
        _check_structured_output(_chat_schema(body), reply)
        _check_tool_choice(body.get("tool_choice"), reply)
        messages = body.get("messages") or []
        if not self.multimodal and any(map(_has_image, messages)):
            raise EngineRefusal(400, f"{self.model_name} is not a multimodal model")
        tools = body.get("tools") or None
        prompt = self.prompt_ids(
            messages, tools, continue_final=body.get("continue_final_message") is True
        )
        sampled, finish, calls, stop = self.sample(reply, self.room(prompt, body), _stops(body))
        if body.get("parallel_tool_calls") is False:
            calls = calls[:1]  # as vLLM does: the sampled ids stay whole, the reply keeps one
        content = reply.content.split(stop)[0] if stop else reply.content
        if body.get("tool_choice") == "none" and calls:
            # vLLM parses no calls under tool_choice none: the call's text is the answer.
            text = self.tokenizer.decode(sampled, skip_special_tokens=True)
            content, calls, finish = split_think(text)[1], [], "stop"
        entries = self.logprob_entries(sampled)
        reply_body = {
            "id": "chatcmpl-" + uuid.uuid4().hex[:24],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "prompt_token_ids": prompt,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": content or None,
                        "reasoning_content": reply.reasoning,
                        "tool_calls": calls,
                    },
                    "finish_reason": finish,
                    "stop_reason": stop,
                    "token_ids": sampled,
                    "logprobs": {"content": entries},
                }
            ],
            "usage": usage_body(len(prompt), len(sampled)),
        }
        self.log.append(reply_body)
        return reply_body


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _chat_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The schema a chat body's ``response_format`` asks for (``{}`` for any JSON object)."""
    spec = body.get("response_format")
    if not isinstance(spec, dict) or spec.get("type") in (None, "text"):
        return None
    if spec.get("type") == "json_schema":
        return dict((spec.get("json_schema") or {}).get("schema") or {})
    return {"type": "object"}


def _token_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The schema a token prompt's ``structured_outputs`` asks for (vLLM's shape)."""
    spec = body.get("structured_outputs")
    if not isinstance(spec, dict):
        return None
    if isinstance(spec.get("json"), dict):
        return dict(spec["json"])
    return {"type": "object"} if spec.get("json_object") else None


def _token_regex(body: dict[str, Any]) -> re.Pattern[str] | None:
    """The regex a token prompt's ``structured_outputs`` asks for; a broken one is a 400."""
    spec = body.get("structured_outputs")
    pattern = spec.get("regex") if isinstance(spec, dict) else None
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise EngineRefusal(400, "structured_outputs.regex must be a string")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise EngineRefusal(
            400, f"Invalid regular expression in structured_outputs: {exc}"
        ) from exc


def _check_regex(pattern: re.Pattern[str], text: str) -> None:
    """A constrained engine samples only text the regex matches whole; a scripted reply that
    does not is a script error, answered as one rather than sent on as if constrained."""
    if pattern.fullmatch(text) is None:
        raise EngineRefusal(
            400, f"structured output: the scripted reply {text[:80]!r} does not match the regex"
        )


def _check_tool_choice(choice: Any, reply: ScriptedReply) -> None:
    """vLLM's chat endpoint forces a call for ``required`` or a named function (guided
    decoding); a scripted reply that would break that is a script error."""
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if choice != "required" and named is None:
        return
    if not reply.tool_calls or (named and any(n != named for n, _ in reply.tool_calls)):
        raise EngineRefusal(
            400, f"structured output: the scripted reply does not honour tool_choice {choice!r}"
        )


def _image_tokens(message: dict[str, Any]) -> dict[str, Any]:
    """How the scripted model sees an image it takes (multimodal): its own ``<image>`` text,
    standing in for a vision model's placeholder tokens."""
    if not _has_image(message):
        return message
    parts = [
        {"type": "text", "text": "<image>"} if p.get("type") == "image_url" else p
        for p in message["content"]
        if isinstance(p, dict)
    ]
    return {**message, "content": parts}


def _has_image(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") == "image_url" for p in content
    )


def _check_structured_output(schema: dict[str, Any] | None, reply: ScriptedReply) -> None:
    """A strict engine's output always matches the schema it was given; a scripted reply that
    would not is a script error, answered as one rather than sent on as if constrained."""
    if schema is None or reply.error_status:
        return
    try:
        value = json.loads(reply.content)
    except json.JSONDecodeError as exc:
        raise EngineRefusal(
            400, f"structured output: the scripted reply is not JSON ({exc})"
        ) from exc
    problem = _schema_problem(value, schema, "$")
    if problem:
        raise EngineRefusal(400, f"structured output: the scripted reply {problem}")


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def _schema_problem(value: Any, schema: dict[str, Any], at: str) -> str | None:
    """The first way ``value`` breaks ``schema`` (type, enum, required, properties, items,
    additionalProperties: false), or None; enough JSON Schema for scripted replies."""
    kinds = schema.get("type")
    if isinstance(kinds, str):
        kinds = [kinds]
    if isinstance(kinds, list):
        is_bool = isinstance(value, bool)
        if not any(
            isinstance(value, _JSON_TYPES.get(k, ())) and (k == "boolean" or not is_bool)
            for k in kinds
        ):
            return f"has {at} that is not of type {'/'.join(kinds)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"has {at} outside its enum"
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for name in schema.get("required") or []:
            if name not in value:
                return f"lacks the required {at}.{name}"
        for name, item in value.items():
            if name in properties:
                problem = _schema_problem(item, properties[name], f"{at}.{name}")
                if problem:
                    return problem
            elif schema.get("additionalProperties") is False:
                return f"has {at}.{name}, which the schema does not allow"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problem = _schema_problem(item, schema["items"], f"{at}[{i}]")
            if problem:
                return problem
    return None


def _stops(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    return [stop] if isinstance(stop, str) else [s for s in stop or [] if isinstance(s, str)]


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
        if isinstance(messages, list) and not backend.multimodal and any(map(_has_image, messages)):
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
        ``noncanonical`` (sample as real models do; see the module docstring)."""
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
