"""The embedded engine's HTTP face: an OpenAI-compatible app shaped like vLLM's server.

Replies carry vLLM's token fields (top-level ``prompt_token_ids``, per-choice ``token_ids``,
``logprobs.content``) plus SGLang's ``token_id`` inside each logprob entry, so one gateway
parser serves every engine. Unknown body fields are ignored; sampling fields Polar cannot
honour are listed under ``sampling.ignored_params`` rather than silently dropped. Errors use
vLLM's shape, ``{"error": {"message", "type", "code"}}``, with Retry-After on 429/503.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from polar.engines.embedded.core import EmbeddedEngineCore
from polar.engines.embedded.results import ChoiceResult, GenerationResult
from polar.engines.embedded.sampling import GenerationParams
from polar.engines.types import usage_body
from polar.errors import GatewayError, InvalidRequest, NotFound

# vLLM's stand-in for a logprob of -inf, which JSON cannot carry.
NEG_INF_LOGPROB = -9999.0
ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "RateLimitError",
    503: "ServiceUnavailableError",
}
# Sampling fields Polar does not implement, with the value that means "off".
UNSUPPORTED_DEFAULTS: dict[str, Any] = {
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "repetition_penalty": 1,
    "min_p": 0,
    "min_tokens": 0,
    "logit_bias": None,
    "best_of": 1,
    "use_beam_search": False,
}


def create_app(
    core: EmbeddedEngineCore, *, served_model_names: list[str] | None = None
) -> Starlette:
    """The ASGI app serving ``core``; mount it on a port or call it via ``httpx.ASGITransport``."""
    names = [core.model_name, *(served_model_names or [])]
    created = int(time.time())

    def check_model(body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model not in names:
            raise NotFound(f"The model `{model}` does not exist (served: {', '.join(names)}).")

    async def chat_completions(request: Request) -> Response:
        body = await _json_body(request)
        check_model(body)
        if body.get("stream"):
            raise InvalidRequest(
                "stream is not supported by the embedded engine; Polar's gateway calls engines "
                "without streaming and replays the reply to streaming clients"
            )
        tools = _tools(body)
        params = parse_params(body)
        messages: Any = body.get("messages")
        _refuse_images(messages, core.model_name)
        result = await core.generate(
            messages,
            tools,
            params,
            tool_choice=body.get("tool_choice"),
            continue_final=body.get("continue_final_message") is True,
            single_tool_call=body.get("parallel_tool_calls") is False,
        )
        return _json(render_completion(result, logprobs=params.logprobs))

    async def completions(request: Request) -> Response:
        body = await _json_body(request)
        check_model(body)
        if body.get("stream"):
            raise InvalidRequest("stream is not supported by the embedded engine")
        prompt = body.get("prompt")
        if not isinstance(prompt, list):
            raise InvalidRequest(
                "prompt must be a list of token ids (Polar's gateway renders text prompts itself)"
            )
        # The completions API's logprobs is a count of top alternatives (0: the sampled only).
        params = parse_params({**body, "logprobs": body.get("logprobs") is not None})
        result = await core.generate_ids(prompt, params)
        return _json(render_text_completion(result, logprobs=params.logprobs))

    async def models(request: Request) -> Response:
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "polar",
                "root": core.loaded.source,
                "max_model_len": core.max_model_len,
            }
            for name in names
        ]
        return _json({"object": "list", "data": data})

    async def tokenize(request: Request) -> Response:
        body = await _json_body(request)
        check_model(body)
        if "messages" in body:
            _refuse_images(body["messages"], core.model_name)
            rendered = await asyncio.to_thread(
                core.render,
                body["messages"],
                _tools(body),
                add_generation_prompt=_bool(body, "add_generation_prompt", True),
            )
            ids = rendered.ids
        elif isinstance(body.get("prompt"), str):
            ids = await asyncio.to_thread(
                core.encode,
                body["prompt"],
                add_special_tokens=_bool(body, "add_special_tokens", True),
            )
        else:
            raise InvalidRequest("tokenize needs `messages` (a list) or `prompt` (a string)")
        token_strs = (
            [core.decode([t]) for t in ids] if _bool(body, "return_token_strs", False) else None
        )
        return _json(
            {
                "count": len(ids),
                "max_model_len": core.max_model_len,
                "tokens": ids,
                "token_strs": token_strs,
            }
        )

    async def detokenize(request: Request) -> Response:
        body = await _json_body(request)
        check_model(body)
        tokens = body.get("tokens")
        vocab = len(core.tokenizer)
        if not isinstance(tokens, list) or not all(_is_int(t) and 0 <= t < vocab for t in tokens):
            raise InvalidRequest(f"tokens must be a list of token ids in [0, {vocab})")
        return _json({"prompt": await asyncio.to_thread(core.decode, tokens)})

    async def health(request: Request) -> Response:
        return _json({"status": "ok", **core.stats()})

    async def on_gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return error_response(exc)

    async def on_unexpected_error(request: Request, exc: Exception) -> Response:
        return error_response(GatewayError(f"embedded engine failure: {exc!r}"))

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/detokenize", detokenize, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ],
        exception_handlers={GatewayError: on_gateway_error, 500: on_unexpected_error},
    )


def parse_params(body: dict[str, Any]) -> GenerationParams:
    """Chat-completions sampling fields as validated :class:`GenerationParams` (400 if bad)."""
    max_tokens = _int(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens")
    n = _int(body, "n")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise InvalidRequest("stop must be a string or a list of strings")
    stop_token_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_token_ids, list) or not all(_is_int(t) for t in stop_token_ids):
        raise InvalidRequest("stop_token_ids must be a list of integers")
    top_k = _int(body, "top_k")
    ignored = [
        key
        for key, off in UNSUPPORTED_DEFAULTS.items()
        if body.get(key) is not None and body.get(key) not in (off, {}, [])
    ]
    if body.get("tool_choice") == "required" or isinstance(body.get("tool_choice"), dict):
        ignored.append("tool_choice")
    _refuse_structured_output(body)
    return GenerationParams(
        max_tokens=max_tokens,
        temperature=_float(body, "temperature", 1.0),
        top_p=_float(body, "top_p", 1.0),
        top_k=0 if top_k is None else top_k,
        seed=_int(body, "seed"),
        n=1 if n is None else n,
        stop=tuple(stop or ()),
        stop_token_ids=tuple(stop_token_ids),
        ignore_eos=_bool(body, "ignore_eos", False),
        logprobs=_bool(body, "logprobs", False),
        top_logprobs=_int(body, "top_logprobs") or 0,
        ignored=tuple(ignored),
    )


def _refuse_images(messages: Any, model: str) -> None:
    """The embedded models are text-only: an image is a 400 as vLLM gives one, never text
    standing in for pixels the model did not see."""
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") == "image_url" for p in content
        ):
            raise InvalidRequest(f"{model} is not a multimodal model")


def _refuse_structured_output(body: dict[str, Any]) -> None:
    """The embedded engine has no constrained decoding: asking for JSON is a 400, never a
    reply that merely hopes to be JSON."""
    response_format = body.get("response_format")
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    asked = f"response_format {kind}" if kind not in (None, "text") else None
    for key in ("structured_outputs", "guided_json"):
        if body.get(key) is not None:
            asked = key
    if asked is not None:
        raise InvalidRequest(
            f"structured output ({asked}) is not supported by the embedded engine: it has no "
            "constrained decoding; serve the model with vLLM or SGLang for JSON output"
        )


def render_completion(result: GenerationResult, *, logprobs: bool = True) -> dict[str, Any]:
    """A vLLM-shaped chat completion, with SGLang's ``token_id`` in each logprob entry."""
    choices = [_render_choice(choice, logprobs) for choice in result.choices]
    completion_tokens = sum(len(c.token_ids) for c in result.choices)
    return {
        "id": result.id,
        "object": "chat.completion",
        "created": result.created,
        "model": result.model,
        "prompt_token_ids": result.prompt_ids,
        "choices": choices,
        "usage": usage_body(len(result.prompt_ids), completion_tokens),
        "policy_version": result.policy_version,
        "sampling": result.sampling,
        "engine_timing": result.timing,
    }


def render_text_completion(result: GenerationResult, *, logprobs: bool = True) -> dict[str, Any]:
    """A vLLM-shaped text completion for a token prompt: per-choice ``token_ids`` and
    ``prompt_token_ids`` (vLLM's ``return_token_ids``), ``logprobs.token_logprobs``."""
    choices = []
    for choice in result.choices:
        entries = None
        if logprobs:
            entries = {
                "tokens": choice.token_texts,
                "token_logprobs": [
                    lp if math.isfinite(lp) else NEG_INF_LOGPROB for lp in choice.logprobs
                ],
                "top_logprobs": None,
                "text_offset": None,
            }
        choices.append(
            {
                "index": choice.index,
                "text": choice.text,
                "logprobs": entries,
                "finish_reason": choice.finish_reason,
                "stop_reason": choice.stop_reason,
                "prompt_token_ids": result.prompt_ids,
                "token_ids": choice.token_ids,
            }
        )
    completion_tokens = sum(len(c.token_ids) for c in result.choices)
    return {
        "id": "cmpl-" + result.id.removeprefix("chatcmpl-"),
        "object": "text_completion",
        "created": result.created,
        "model": result.model,
        "choices": choices,
        "usage": usage_body(len(result.prompt_ids), completion_tokens),
        "policy_version": result.policy_version,
        "sampling": result.sampling,
    }


def error_response(error: GatewayError) -> Response:
    headers = {}
    if error.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
    body = {
        "error": {
            "message": error.message,
            "type": ERROR_TYPES.get(error.status, "InternalServerError"),
            "code": error.status,
        }
    }
    return _json(body, status=error.status, headers=headers)


def _render_choice(choice: ChoiceResult, logprobs: bool) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": (choice.content or None) if choice.tool_calls else choice.content,
        "tool_calls": choice.tool_calls,
        "reasoning_content": None,
    }
    return {
        "index": choice.index,
        "message": message,
        "logprobs": {"content": _logprob_entries(choice)} if logprobs else None,
        "finish_reason": choice.finish_reason,
        "stop_reason": choice.stop_reason,
        "token_ids": choice.token_ids,
    }


def _logprob_entries(choice: ChoiceResult) -> list[dict[str, Any]]:
    entries = []
    for i, (token_id, text, logprob) in enumerate(
        zip(choice.token_ids, choice.token_texts, choice.logprobs, strict=True)
    ):
        top = choice.top_logprobs[i] if choice.top_logprobs is not None else []
        entry = _logprob_entry(token_id, text, logprob)
        entry["top_logprobs"] = [_logprob_entry(t, s, lp) for t, s, lp in top]
        entries.append(entry)
    return entries


def _logprob_entry(token_id: int, text: str, logprob: float) -> dict[str, Any]:
    return {
        "token": text,
        "logprob": logprob if math.isfinite(logprob) else NEG_INF_LOGPROB,
        "bytes": list(text.encode("utf-8")),
        "token_id": token_id,
    }


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise InvalidRequest("tools must be a list")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(f"tools[{i}] must be a function tool with a name")
    return tools or None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_int(value):
        raise InvalidRequest(f"{key} must be an integer, got {value!r}")
    return int(value)


def _float(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{key} must be a number, got {value!r}")
    return float(value)


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"{key} must be true or false, got {value!r}")
    return value


def _json(body: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body), status_code=status, headers=headers, media_type="application/json"
    )
