"""An HTTP client for OpenAI-compatible engine servers; vLLM and SGLang differ only in flags."""

from __future__ import annotations

from typing import Any, ClassVar

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from polar.capture import routed_experts
from polar.engines.base import Engine
from polar.engines.capture import capture_from_response
from polar.engines.http import AiohttpEngineHTTP, EngineHTTP, HttpxEngineHTTP, RawReply
from polar.engines.pool import routing_key
from polar.engines.token_in import from_vllm_completion
from polar.engines.types import EngineResult, ModelInfo, PrefixCacheCounters, SampledTokens
from polar.errors import (
    EngineError,
    EngineRejected,
    EngineTimeout,
    EngineUnavailable,
    GatewayError,
    RateLimited,
)
from polar.providers.types import NormalizedRequest, ResponseFormat


def vllm_structured_outputs(response_format: ResponseFormat) -> dict[str, Any]:
    """vLLM's structured output on ``/v1/completions`` (``guided_json`` before 0.11, removed
    in 0.12): ``structured_outputs`` with ``json`` (a schema) or ``json_object``."""
    if response_format.kind == "json_object":
        return {"structured_outputs": {"json_object": True}}
    return {"structured_outputs": {"json": response_format.schema}}


class OpenAICompatEngine(Engine):
    """Calls ``/v1/chat/completions`` without streaming, asking for token ids and logprobs.

    ``timeout_s`` bounds each call as a whole. ``transport`` (an httpx transport, e.g.
    ``httpx.ASGITransport``) calls an in-process engine instead of a server.
    """

    name: ClassVar[str] = "openai_compat"
    # Body fields that make the server return prompt ids, sampled ids and logprobs.
    token_flags: ClassVar[dict[str, Any]] = {"logprobs": True, "top_logprobs": 0}
    # Where token prompts go, and how the reply is read (vLLM's shape unless overridden).
    token_path: ClassVar[str] = "/v1/completions"
    read_token_reply = staticmethod(from_vllm_completion)
    # The body fields that ask a token prompt for structured output (chat bodies carry
    # ``response_format`` as OpenAI does, which vLLM and SGLang both take).
    token_structured_output = staticmethod(vllm_structured_outputs)
    regex_constraint: ClassVar[str | None] = "structured_outputs.regex"

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
        extra_body: dict[str, Any] | None = None,
        max_connections: int = 1024,
        routing_header: str | None = None,
    ) -> None:
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self.base_url = base_url.rstrip("/")
        self.extra_body = dict(extra_body or {})
        self.timeout_s = timeout_s
        # An external router's session header (vllm-router's X-Session-ID, sglang-router's
        # X-SMG-Routing-Key): each call carries its session's routing key there.
        self.routing_header = routing_header
        self._http: EngineHTTP
        if transport is not None:
            self._http = HttpxEngineHTTP(self.base_url, headers, timeout_s, transport)
        else:
            self._http = AiohttpEngineHTTP(self.base_url, headers, timeout_s, max_connections)

    def build_body(self, request: NormalizedRequest) -> dict[str, Any]:
        body = request.chat_body()
        body.update(self.token_flags)
        body.update(self.extra_body)
        body["stream"] = False
        return body

    async def complete(self, request: NormalizedRequest) -> EngineResult:
        body = self.build_body(request)
        reply = await self._post("/v1/chat/completions", body, request)
        completion, tokens = capture_from_response(reply)
        tokens.routed_experts = routed_experts.read_choice(
            reply["choices"][0], len(tokens.prompt_ids), len(tokens.sampled_ids), tokens.flags
        )
        version = reply.get("policy_version")
        return EngineResult(
            completion=completion,
            tokens=tokens,
            engine=self.name,
            upstream_request=body,
            sampling=request.params.as_dict() | dict(reply.get("sampling") or {}),
            policy_version=version if isinstance(version, int) else None,
        )

    def build_token_body(self, prompt_ids: list[int], request: NormalizedRequest) -> dict[str, Any]:
        """vLLM's completions endpoint with a token prompt: ids in, sampled ids out."""
        body: dict[str, Any] = {"model": request.model, "prompt": prompt_ids}
        body.update(request.params.as_dict())
        body.update({"return_token_ids": True, "logprobs": 0, "stream": False})
        if request.response_format is not None:
            body.update(self.token_structured_output(request.response_format))
        if request.forced_call_pattern is not None:
            body["structured_outputs"] = {"regex": request.forced_call_pattern}
        body.update(self.extra_body)
        return body

    async def complete_tokens(
        self, prompt_ids: list[int], request: NormalizedRequest
    ) -> SampledTokens:
        body = self.build_token_body(prompt_ids, request)
        reply = await self._post(self.token_path, body, request)
        tokens = self.read_token_reply(reply, body)
        tokens.routed_experts = routed_experts.read_choice(
            reply["choices"][0] if reply.get("choices") else None,
            len(prompt_ids),
            len(tokens.sampled_ids),
            tokens.flags,
        )
        tokens.sampling = request.params.as_dict() | tokens.sampling
        return tokens

    async def model_info(self) -> ModelInfo | None:
        response = await self._http.get("/v1/models")
        if response.status >= 400:
            raise _engine_error(response)
        try:
            data = orjson.loads(response.content).get("data") or []
        except (orjson.JSONDecodeError, AttributeError) as exc:
            raise EngineError(f"engine's /v1/models is not a model list: {exc}") from exc
        if not data or not isinstance(data[0], dict) or not data[0].get("id"):
            return None
        first = data[0]
        window = first.get("max_model_len")
        return ModelInfo(
            name=str(first["id"]),
            max_model_len=window if isinstance(window, int) and window > 0 else None,
            root=str(first["root"]) if first.get("root") else None,
        )

    async def prefix_cache_counters(self) -> dict[str, PrefixCacheCounters]:
        """vLLM's counters from its ``/metrics`` ({} for a server without them)."""
        response = await self._http.get("/metrics")
        if response.status >= 400:
            return {}
        counters = read_prefix_cache(response.content.decode("utf-8", "replace"))
        return {self.name: counters} if counters is not None else {}

    async def count_tokens(self, request: NormalizedRequest) -> int:
        body: dict[str, Any] = {
            "model": request.model,
            "messages": request.messages,
            "add_generation_prompt": True,
        }
        if request.tools:
            body["tools"] = request.tools
        # The reasoning switch changes the prompt (Qwen3's closed thought): counted as sent.
        switch = request.engine_reasoning_fields().get("chat_template_kwargs")
        if switch is not None:
            body["chat_template_kwargs"] = switch
        reply = await self._post("/tokenize", body, request)
        count = reply.get("count")
        if count is None:
            count = len(reply.get("tokens") or [])
        return int(count)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _post(
        self, path: str, body: dict[str, Any], request: NormalizedRequest
    ) -> dict[str, Any]:
        headers = None
        if self.routing_header and request.session_id:
            headers = {self.routing_header: routing_key(request.session_id)}
        response = await self._http.post(path, orjson.dumps(body), headers)
        if response.status >= 400:
            raise _engine_error(response)
        try:
            reply = orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            raise EngineError(
                f"engine returned invalid JSON ({len(response.content)} bytes)"
            ) from exc
        if not isinstance(reply, dict):
            raise EngineError("engine returned a non-object reply")
        return reply


def _engine_error(response: RawReply) -> GatewayError:
    """Turn an engine's HTTP error into a typed error that keeps the engine's own message."""
    message = response.content[:2000].decode("utf-8", "replace")
    try:
        payload = orjson.loads(response.content)
        err = payload.get("error") if isinstance(payload, dict) else None
        if isinstance(err, dict) and err.get("message"):
            message = str(err["message"])
        elif isinstance(payload, dict) and payload.get("message"):
            message = str(payload["message"])
        elif isinstance(payload, dict) and isinstance(payload.get("detail"), str):
            message = payload["detail"]
    except orjson.JSONDecodeError:
        pass
    text = f"engine refused the request (HTTP {response.status}): {message}"
    retry_after = _retry_after(response)
    status = response.status
    if status == 429:
        return RateLimited(text, retry_after=retry_after)
    if status == 503:
        return EngineUnavailable(text, retry_after=retry_after)
    if status == 504:
        return EngineTimeout(text)
    if 400 <= status < 500:
        return EngineRejected(text, status=400 if status in (400, 404, 422) else status)
    return EngineError(text)


def _retry_after(response: RawReply) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value else None
    except ValueError:
        return None


def read_prefix_cache(text: str) -> PrefixCacheCounters | None:
    """vLLM's prefix-cache query and hit counters in a Prometheus exposition, summed over its
    engines and models; None when the text has no such counters."""
    totals = {"vllm:prefix_cache_queries": 0.0, "vllm:prefix_cache_hits": 0.0}
    seen = False
    for family in text_string_to_metric_families(text):
        if family.name in totals:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    totals[family.name] += sample.value
                    seen = True
    if not seen:
        return None
    return PrefixCacheCounters(
        totals["vllm:prefix_cache_queries"], totals["vllm:prefix_cache_hits"]
    )
