"""The proxy flow for one model call: session -> detect -> normalize -> engine -> capture -> reply.

Every error on this path is rendered in the caller's own provider shape, and a completion is
committed to the capture store before its reply leaves, so nothing a harness saw is lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive

from polar.capture.harness_ids import harness_ids
from polar.capture.records import (
    MAX_REQUEST_DEPTH,
    CaptureRecord,
    new_completion_id,
    within_request_depth,
)
from polar.capture.store import CaptureStore
from polar.engines.base import Engine
from polar.engines.types import EngineResult
from polar.errors import (
    AuthenticationFailed,
    ClientDisconnected,
    GatewayError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
)
from polar.gateway.call_ids import CallIds
from polar.gateway.config import GatewayConfig
from polar.gateway.engine_facts import EngineFacts, discover
from polar.gateway.metrics import GatewayMetrics
from polar.gateway.pause import GenerationGate
from polar.gateway.policy import apply_policy
from polar.gateway.request_features import reasoning_for_engine
from polar.gateway.sessions import (
    GatewaySession,
    SessionRegistry,
    SessionTags,
    key_from_headers,
    split_session_prefix,
)
from polar.gateway.stored_replies import StoredReplies
from polar.gateway.streaming import early_refusal, live_stream
from polar.gateway.token_prompts import TokenPrompts, fit_output_budget
from polar.harnesses.registry import harnesses, side_call_tag
from polar.logs import log_event
from polar.providers.base import COUNT_TOKENS, Provider, RequestContext
from polar.providers.registry import ProviderSet, routing_table
from polar.providers.stateful import RETRIEVE
from polar.providers.types import Completion, NormalizedRequest
from polar.rendering.renderer import PromptPlan
from polar.rendering.turns import TurnBook
from polar.schemas.flags import FLAG_WEBSOCKET
from polar.schemas.harness_ids import HarnessIds
from polar.schemas.ids import is_valid_id

log = logging.getLogger("polar.gateway")
T = TypeVar("T")

OVER_WEBSOCKET = "polar.over_websocket"
"""The ASGI scope key (True) of a call a Responses WebSocket frame stands for: its reply is kept
for the connection whatever ``store`` says, and its record is flagged."""


async def _disconnect(receive: Receive) -> None:
    """Returns when the client disconnects (the request body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body), status_code=status, media_type="application/json", headers=headers
    )


class Proxy:
    """The catch-all ASGI endpoint that serves every provider API."""

    def __init__(
        self,
        config: GatewayConfig,
        engine: Engine,
        store: CaptureStore,
        sessions: SessionRegistry,
        gate: GenerationGate,
        metrics: GatewayMetrics,
    ) -> None:
        self.config = config
        self.engine = engine
        self.store = store
        self.sessions = sessions
        self.gate = gate
        self.metrics = metrics
        self.providers = ProviderSet()
        self.policy_version = config.policy_version
        self.pause_wait_s = 600.0
        self.prompts: TokenPrompts | None = None
        self.replies = StoredReplies(store)
        self.call_ids = CallIds(store, sessions)
        self._facts: EngineFacts | None = None
        self._facts_lock = asyncio.Lock()

    async def __call__(self, request: Request) -> Response:
        key, path = split_session_prefix(request.url.path)
        ctx = RequestContext(
            path=path,
            method=request.method,
            query=request.query_params,
            headers=request.headers,
        )
        body: Any = None
        matched = self.providers.by_path(ctx)
        # Until a bare path's body is read, its provider is what its headers say (errors take
        # the caller's shape as far as it is known).
        provider = matched[0] if matched else self.providers.by_headers(ctx)
        try:
            bare = ctx.path in routing_table().bare_paths and request.method == "POST"
            if matched is None and not bare:
                raise NotFound(f"no model API at {request.method} {ctx.path}")
            if matched is not None and matched[1] == RETRIEVE:
                session = self._known_session(key or key_from_headers(ctx.headers, ctx.query))
                return json_response(await self.replies.answer(matched[0], session, ctx))
            if matched is not None and request.method != "POST":
                raise NotFound(f"{ctx.path} accepts POST only")
            # The key before the body: an unknown caller's body is never read.
            key = key or key_from_headers(ctx.headers, ctx.query)
            session = self._known_session(key)
            raw = await self._read_body(request)
            if matched is None:
                body = _loads(raw) if raw else None
                provider = self.providers.fallback(ctx, lambda: body)
                if provider is None:
                    raise NotFound(f"no model API at {request.method} {ctx.path}")
                operation = "generate"
            else:
                operation = matched[1]
                body = _loads(raw)
            assert provider is not None
            session = session or await self._register(key)
            normalized = provider.parse_request(body, ctx)
            # History names each call by the model's own id, whatever id the harness was given
            # (a stored reply's context, put before it next, is the engine's own already).
            call_ids = await self.call_ids.of(session.session_id)
            normalized.messages = call_ids.to_model(normalized.messages)
            await self.replies.resume(provider, session, normalized)
            if normalized.made_up_call_ids:
                normalized.messages = call_ids.own_ids(
                    normalized.messages,
                    normalized.tools,
                    normalized.made_up_call_ids,
                    await self._turn_book(session),
                )
            tag_side_call(session, normalized, ctx)
            if operation == COUNT_TOKENS:
                count = await self._count(session, normalized)
                return json_response(provider.render_token_count(count))
            prepared = _Prepared(
                harness_ids=harness_ids(ctx.headers),
                over_websocket=bool(request.scope.get(OVER_WEBSOCKET)),
            )
            return await self._generate(
                provider, session, normalized, body, request.receive, prepared
            )
        except GatewayError as err:
            self._log_error(self._caller(key, ctx), provider, err)
            return self._error(provider, err)
        except Exception as exc:  # a bug must still answer in the caller's shape
            internal = GatewayError(f"internal gateway error: {exc!r}")
            self._log_error(self._caller(key, ctx), provider, internal, exc)
            return self._error(provider, internal)

    def _caller(self, key: str | None, ctx: RequestContext) -> GatewaySession | None:
        return self.sessions.get(key or key_from_headers(ctx.headers, ctx.query))

    def _log_error(
        self,
        session: GatewaySession | None,
        provider: Provider | None,
        err: GatewayError,
        bug: Exception | None = None,
    ) -> None:
        """``call.error`` (INFO: the caller got its provider's error), or
        ``call.unexpected_error`` with the traceback for a bug. An unknown key is never logged
        (it may be someone's real API key)."""
        tags = session.tags if session is not None else SessionTags()
        log_event(
            log,
            "call.unexpected_error" if bug is not None else "call.error",
            "unexpected gateway error" if bug is not None else f"call answered {err.status}",
            level=logging.ERROR if bug is not None else logging.INFO,
            exc_info=bug,
            session_id=session.session_id if session is not None else None,
            task_id=tags.task_id,
            node_id=tags.node_id,
            provider=provider.name if provider is not None else None,
            kind=err.kind,
            http_status=err.status,
            error=err.message,
        )

    async def _read_body(self, request: Request) -> bytes:
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(
                f"request body of {declared} bytes exceeds the {limit}-byte limit"
            )
        chunks = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
            chunks.append(chunk)
        return b"".join(chunks)

    def _known_session(self, key: str | None) -> GatewaySession | None:
        """The key's session; None for a key ``auto_register`` will make one of (once the body
        has been read and parsed); AuthenticationFailed for any other key, or none."""
        session = self.sessions.get(key)
        if session is not None:
            return session
        if not key:
            raise AuthenticationFailed(
                "no session key: use /s/<session>/... or the session id as API key"
            )
        if self.config.auto_register and is_valid_id(key):
            return None
        raise AuthenticationFailed("unknown session key")

    async def _register(self, key: str | None) -> GatewaySession:
        assert key is not None
        # Another call may have opened it meanwhile: opening is idempotent.
        return await self.sessions.open(key, SessionTags(auto_registered=True))

    async def _generate(
        self,
        provider: Provider,
        session: GatewaySession,
        normalized: NormalizedRequest,
        body: Any,
        receive: Receive,
        prepared: _Prepared,
    ) -> Response:
        prepared.started = time.time()
        session.admit_call()
        call = self.metrics.call(provider.name, normalized.stream)
        session.call_opened()  # until the answer is ready: the engine's time, not the harness's
        try:
            prepared.flags, prepared.plan = await self._prepare(session, normalized)
        except BaseException as exc:
            session.call_closed()
            call.end(exc)
            raise
        work = asyncio.ensure_future(
            self._produce(provider, session, normalized, body, prepared, receive)
        )
        work.add_done_callback(lambda _: session.call_closed())
        if not normalized.stream:
            completion = await call.watch(work, in_stream=False)
            return json_response(provider.render_response(completion, normalized))
        # Everything before this line answers with a plain HTTP error. A stream's headers wait
        # out a short grace: what fails in it (an engine's 429 or 400) keeps its status too;
        # after it the stream opens, and a pause, the engine or the capture write fails in-stream.
        refused = await early_refusal(work, self.config.stream_status_grace_s)
        if refused is not None:
            call.end(refused)
            raise refused
        streamed = self._log_stream_error(call.watch(work, in_stream=True), session, provider)
        return live_stream(provider, normalized, streamed, self.config.stream_keepalive_s)

    async def _log_stream_error(
        self, completion: Awaitable[Completion], session: GatewaySession, provider: Provider
    ) -> Completion:
        """A stream's failure after its headers is answered in-stream; log it here."""
        try:
            return await completion
        except ClientDisconnected:
            raise
        except GatewayError as err:
            self._log_error(session, provider, err)
            raise

    async def _prepare(
        self, session: GatewaySession, normalized: NormalizedRequest
    ) -> tuple[list[str], PromptPlan | None]:
        """The checks before the engine call: store writable, policy, prompt fits the window."""
        self.store.check_writable()  # a full or locked store refuses before the engine runs
        facts = await self.facts()
        flags = apply_policy(normalized, self.config, facts.served_model)
        if self.prompts is not None:
            plan = await self.prompts.plan(
                session.session_id, normalized, facts.context_window, flags
            )
            return flags, plan
        reasoning_for_engine(normalized)
        if facts.context_window:
            prompt_tokens = await self.engine.count_tokens(normalized)
            fit_output_budget(normalized, prompt_tokens, facts.context_window, flags)
        return flags, None

    async def _produce(
        self,
        provider: Provider,
        session: GatewaySession,
        normalized: NormalizedRequest,
        body: Any,
        prepared: _Prepared,
        receive: Receive,
    ) -> Completion:
        """The engine's completion, committed to the capture store before it is returned."""
        plan = prepared.plan
        normalized.session_id = session.session_id
        async with self.gate.admit(self.pause_wait_s):
            if plan is not None and self.prompts is not None:
                tokens = await self._complete(
                    self.metrics.engine_call(self.engine.complete_tokens(plan.ids, normalized)),
                    receive,
                )
                result = self.prompts.result(
                    plan, tokens, normalized, tokens.engine or self.engine.name
                )
            else:
                result = await self._complete(
                    self.metrics.engine_call(self.engine.complete(normalized)), receive
                )
            version = (
                result.policy_version if result.policy_version is not None else self.policy_version
            )
        call_ids = await self.call_ids.of(session.session_id)
        given = call_ids.issue([c.id for c in result.completion.tool_calls])
        record = self._record(provider, session, normalized, body, result, prepared, version, given)
        await self.metrics.capture_commit(self.store.append(record, checked=True))
        self.metrics.tokens(provider.name, len(record.prompt_ids), len(record.sampled_ids))
        if plan is not None and self.prompts is not None:
            self.prompts.remember(session.session_id, plan, record.completion_id, result)
        completion = with_gateway_ids(result.completion, record)
        await self.replies.keep(
            provider, session, completion, normalized, for_connection=prepared.over_websocket
        )
        return completion

    async def facts(self) -> EngineFacts:
        """What the engine serves (model, window) and the renderer; resolved once."""
        if self._facts is None:
            async with self._facts_lock:
                if self._facts is None:
                    facts = await discover(self.config, self.engine)
                    if facts.renderer is not None:
                        self.prompts = TokenPrompts(
                            facts.renderer,
                            self.config.render,
                            self.sessions,
                            self.engine.regex_constraint,
                        )
                    self._facts = facts
        return self._facts

    async def _turn_book(self, session: GatewaySession) -> TurnBook | None:
        """The session's sampled turns, under gateway rendering (else None)."""
        await self.facts()
        return self.prompts.book(session.session_id) if self.prompts is not None else None

    async def _count(self, session: GatewaySession, normalized: NormalizedRequest) -> int:
        """Token counting (count_tokens, input_tokens, countTokens) for the SERVED model: with
        gateway rendering, the length of the very prompt the same request would send."""
        facts = await self.facts()
        apply_policy(normalized, self.config, facts.served_model)
        if self.prompts is not None:
            return await self.prompts.count(session.session_id, normalized)
        return await self.engine.count_tokens(normalized)

    async def _complete(self, engine_call: Awaitable[T], receive: Receive) -> T:
        """The engine's result, unless the caller hangs up first: then the engine call is
        cancelled (vLLM and SGLang abort a request whose connection closes, the embedded engine
        drops it), so a harness that gave up on a call stops costing engine time. Nothing is
        lost: a completion nobody received is not part of any trajectory."""
        call = asyncio.ensure_future(engine_call)
        gone = asyncio.ensure_future(_disconnect(receive))
        try:
            await asyncio.wait((call, gone), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            call.cancel()
            raise
        finally:
            gone.cancel()
        if not call.done():
            call.cancel()
            log.info("caller disconnected; engine call cancelled")
            raise ClientDisconnected("the caller disconnected before the completion was ready")
        return call.result()

    def _record(
        self,
        provider: Provider,
        session: GatewaySession,
        normalized: NormalizedRequest,
        body: Any,
        result: EngineResult,
        prepared: _Prepared,
        version: int | None,
        harness_call_ids: list[str],
    ) -> CaptureRecord:
        completion, flags = result.completion, prepared.flags
        return CaptureRecord(
            completion_id=new_completion_id(),
            engine_completion_id=completion.id,
            session_id=session.session_id,
            provider=provider.name,
            model=normalized.model,
            engine=result.engine,
            policy_version=version,
            started_at=prepared.started,
            finished_at=time.time(),
            request=body if self.config.store_raw_requests else None,
            upstream_request=result.upstream_request,
            response=assistant_message(completion),
            harness_call_ids=harness_call_ids,
            prompt_ids=result.tokens.prompt_ids,
            sampled_ids=result.tokens.sampled_ids,
            logprobs=result.tokens.logprobs,
            finish_reason=completion.finish_reason,
            sampling=result.sampling,
            flags=flags
            + result.tokens.flags
            + ([FLAG_WEBSOCKET] if prepared.over_websocket else []),
            tags=list(normalized.capture.tags),
            dropped_tools=normalized.dropped_tools,
            notes=normalized.capture.record_notes(),
            routed_experts=result.tokens.routed_experts,
            harness_ids=prepared.harness_ids,
        )

    def _error(self, provider: Provider | None, err: GatewayError) -> Response:
        self.metrics.error(provider.name if provider else "unknown", err)
        provider = provider or self.providers.by_name["openai_chat"]
        headers = {"retry-after": str(int(err.retry_after))} if err.retry_after else None
        return json_response(provider.error_body(err), status=err.status, headers=headers)


@dataclass
class _Prepared:
    """What one call brought (its headers, its transport) and what the pre-checks decided."""

    harness_ids: HarnessIds | None = None  # the CLI's own agent ids, from the request headers
    over_websocket: bool = False  # a WebSocket frame: its connection keeps its replies
    started: float = 0.0
    flags: list[str] = field(default_factory=list)
    plan: PromptPlan | None = None


def with_gateway_ids(completion: Completion, record: CaptureRecord) -> Completion:
    """The completion under its record's ids, as the harness sees them: the call's own
    (engines may repeat theirs) and each tool call's issued id (models may repeat theirs)."""
    completion.id = record.completion_id
    for call, given in zip(completion.tool_calls, record.harness_call_ids, strict=True):
        call.id = given
    return completion


def assistant_message(completion: Completion) -> dict[str, Any]:
    """The completion as a chat-completions assistant message (how records store it)."""
    message: dict[str, Any] = {"role": "assistant", "content": completion.content}
    if completion.reasoning:
        message["reasoning"] = completion.reasoning
    if completion.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in completion.tool_calls
        ]
    return message


def tag_side_call(
    session: GatewaySession, normalized: NormalizedRequest, ctx: RequestContext
) -> None:
    """Tag calls that are not agent turns (titles, routing, memory) by the session's harness."""
    harness = session.tags.harness
    if harness is None or harness not in harnesses:
        return
    tag = side_call_tag(harness, normalized, ctx.headers)
    if tag:
        normalized.capture.tags.append(tag)


def _loads(raw: bytes) -> Any:
    if not raw:
        raise InvalidRequest("request body is empty; expected JSON")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from exc
    if not within_request_depth(body):
        raise InvalidRequest(f"request body nests deeper than {MAX_REQUEST_DEPTH} levels")
    return body
