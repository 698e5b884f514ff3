"""OpenAI Responses over a WebSocket: ``.../responses`` upgraded, as Codex speaks it with
``supports_websockets`` (OpenAI's "WebSocket mode").

The client sends ``{"type": "response.create", ...}`` text frames, each a Responses create body
(``stream`` implicit); a later turn sends only its new input and the ``previous_response_id`` of
the response before. The server answers each with the same events the SSE stream carries, one
JSON text frame each.

Nothing here serves a model call itself: each frame is handed to the gateway's proxy as the
streaming ``POST .../responses`` it stands for, with the upgrade request's path and headers (the
session key among them), so auth, capture, token-in rendering and ``previous_response_id`` are
the HTTP path's own, and its SSE frames are re-sent as text frames. What only the transport has
is here:

- the key is checked at the upgrade: an unknown one is refused with HTTP 401 before any frame;
- a refusal before the stream (HTTP 400, 401, 429, ...) is an ``error`` event with its
  ``status`` and error object (``{"type": "error", "status": 429, "error": {...}}``, the shape
  Codex maps back to the HTTP status); a bad frame is one too, and the socket stays open;
- replies are kept for the connection even under ``store: false`` (as OpenAI keeps the last
  one in connection memory) and forgotten when it closes;
- a warm-up frame (``generate: false``) samples nothing: it answers ``response.created`` and
  ``response.completed`` with no output, and a frame continuing it is served as one request
  with the warm-up's input first (Codex pre-warms this way and then sends an empty delta).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from starlette.datastructures import Headers, QueryParams
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Scope
from starlette.websockets import WebSocket

from polar.errors import GatewayError, InvalidRequest
from polar.gateway.proxy import OVER_WEBSOCKET, Proxy
from polar.gateway.sessions import key_from_headers, split_session_prefix
from polar.providers.base import GENERATE, RequestContext, new_id
from polar.providers.openai_responses import OpenAIResponsesProvider
from polar.providers.openai_responses_output import StreamEvents, response_object
from polar.providers.types import Completion

log = logging.getLogger("polar.gateway")

CREATE = "response.create"
PROCESSED = "response.processed"  # newer Codex acknowledges a response it has handled: no answer
# Upgrade headers that describe the socket, not the POST a frame stands for.
_SOCKET_HEADERS = frozenset(
    {b"connection", b"upgrade", b"content-length", b"content-type", b"transfer-encoding"}
)
POLICY_CLOSE = 1008  # the close code for a socket refused before its upgrade completes


class ResponsesSocket:
    """One WebSocket endpoint in front of ``proxy`` (registered for every path; only a
    Responses create path is served)."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    async def serve(self, websocket: WebSocket) -> None:
        try:
            key = self._admit(websocket.scope)
        except GatewayError as err:
            await _refuse(websocket, err, self.proxy.providers.by_name["openai_responses"])
            return
        await websocket.accept()
        connection = _Connection(self.proxy, websocket, key)
        await connection.run()

    def _admit(self, scope: Scope) -> str | None:
        """The session key, after checking the path serves Responses and the key is live."""
        key, path = split_session_prefix(scope["path"])
        headers = Headers(scope=scope)
        ctx = RequestContext(path=path, method="POST", headers=headers)
        matched = self.proxy.providers.by_path(ctx)
        if matched is None or matched[1] != GENERATE:
            raise GatewayError(f"no Responses WebSocket at {path}", status=404)
        if not isinstance(matched[0], OpenAIResponsesProvider):
            raise GatewayError(f"{matched[0].name} has no WebSocket mode", status=404)
        key = key or key_from_headers(headers, QueryParams(scope.get("query_string", b"")))
        self.proxy._known_session(key)  # AuthenticationFailed for an unknown key
        return key


class _Connection:
    """One open socket: its frames in order, each served to the end before the next."""

    def __init__(self, proxy: Proxy, websocket: WebSocket, key: str | None) -> None:
        self.proxy = proxy
        self.provider = proxy.providers.by_name["openai_responses"]
        self.websocket = websocket
        self.key = key
        self.closed = asyncio.Event()
        self.frames: asyncio.Queue[Message] = asyncio.Queue()
        self.warmups: dict[str, dict[str, Any]] = {}  # warm-up response id -> its frame
        self.unstored: list[str] = []  # replies kept only for this connection (store: false)

    async def run(self) -> None:
        reader = asyncio.ensure_future(self._read())
        try:
            while True:
                message = await self.frames.get()
                if message["type"] == "websocket.disconnect":
                    return
                await self._frame(message)
        finally:
            reader.cancel()
            await self._forget_unstored()

    async def _read(self) -> None:
        """Every message into ``frames``; a close also sets ``closed`` (which cancels a call in
        flight, as a hung-up HTTP caller does)."""
        while True:
            message = await self.websocket.receive()
            await self.frames.put(message)
            if message["type"] == "websocket.disconnect":
                self.closed.set()
                return

    async def _frame(self, message: Message) -> None:
        try:
            body = _create_body(message)
            if body is None:
                return
            if body.get("generate") is False:
                await self._warm_up(body)
                return
            await self._create(self._after_warmup(body))
        except GatewayError as err:
            await self._send_error(err.status, self.provider.error_body(err), None)

    async def _create(self, body: dict[str, Any]) -> None:
        """``body`` through the proxy as a streaming POST; its events as text frames."""
        stream = _SseFrames()
        status: list[int] = []
        error: list[bytes] = []
        headers: dict[str, str] = {}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
                for name, value in message.get("headers", []):
                    if name == b"retry-after":
                        headers["retry-after"] = value.decode("latin-1")
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                if status and status[0] != 200:
                    error.append(chunk)
                    return
                for event in stream.feed(chunk):
                    await self._send(event)

        scope = self._post_scope()
        receive = self._receive(orjson.dumps(body))
        response: Response = await self.proxy(Request(scope, receive))
        await response(scope, receive, send)
        if status and status[0] != 200:
            await self._send_error(status[0], _json(b"".join(error)), headers or None)
            return
        if body.get("store") is False:
            reply = stream.response_id
            if reply is not None:
                self.unstored.append(reply)

    async def _warm_up(self, body: dict[str, Any]) -> None:
        """A ``generate: false`` frame: checked as a request would be, answered with an empty
        response whose id a later frame may continue, and nothing sampled or captured."""
        self.proxy._known_session(self.key)  # a session closed meanwhile: 401, as a POST gets
        prepared = self._after_warmup({k: v for k, v in body.items() if k != "generate"})
        ctx = RequestContext(path="/v1/responses", method="POST", headers=self.websocket.headers)
        request = self.provider.parse_request(prepared, ctx)
        completion = Completion(id=new_id("resp_"), model=request.model, created=int(time.time()))
        events = StreamEvents()
        opening = response_object(completion, request, [], in_progress=True)
        events.emit("response.created", response=opening)
        events.emit("response.completed", response=response_object(completion, request, []))
        reply = "resp_" + completion.id.removeprefix("resp_")
        self.warmups[reply] = prepared
        stream = _SseFrames()
        for event in stream.feed(b"".join(events.frames)):
            await self._send(event)

    def _after_warmup(self, body: dict[str, Any]) -> dict[str, Any]:
        """A frame continuing a warm-up, as the one request it stands for: the warm-up's input
        first, and the warm-up's own ``previous_response_id`` (if any)."""
        warm = self.warmups.get(str(body.get("previous_response_id")))
        if warm is None:
            return body
        merged = {**body, "input": _items(warm.get("input")) + _items(body.get("input"))}
        merged.pop("previous_response_id")
        if warm.get("previous_response_id") is not None:
            merged["previous_response_id"] = warm["previous_response_id"]
        return merged

    def _post_scope(self) -> Scope:
        """The HTTP scope of the POST a frame stands for: the upgrade's path and headers."""
        socket = self.websocket.scope
        headers = [(n, v) for n, v in socket["headers"] if n not in _SOCKET_HEADERS]
        headers = [h for h in headers if not h[0].startswith(b"sec-websocket-")]
        headers.append((b"content-type", b"application/json"))
        return {
            **socket,
            "type": "http",
            "method": "POST",
            "scheme": "https" if socket.get("scheme") == "wss" else "http",
            "headers": headers,
            # 2.3: the streamed reply watches receive() for the caller hanging up.
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            OVER_WEBSOCKET: True,
        }

    def _receive(self, body: bytes) -> Callable[[], Any]:
        sent = False

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await self.closed.wait()
            return {"type": "http.disconnect"}

        return receive

    async def _send(self, event: bytes) -> None:
        if not self.closed.is_set():
            await self.websocket.send_text(event.decode())

    async def _send_error(self, status: int, body: Any, headers: dict[str, str] | None) -> None:
        error = body.get("error") if isinstance(body, dict) else None
        event: dict[str, Any] = {"type": "error", "status": status, "error": error or body}
        if headers:
            event["headers"] = headers
        await self._send(orjson.dumps(event))

    async def _forget_unstored(self) -> None:
        if self.key is None:
            return
        for reply in self.unstored:
            await self.proxy.store.forget_reply(self.key, reply)


class _SseFrames:
    """The JSON events of an SSE byte stream, as they complete; comments (keep-alives) are
    dropped: a socket's own pings keep it alive."""

    def __init__(self) -> None:
        self._buffer = b""
        self.response_id: str | None = None

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buffer += chunk
        *frames, self._buffer = self._buffer.split(b"\n\n")
        events = []
        for frame in frames:
            data = [line[5:].strip() for line in frame.split(b"\n") if line.startswith(b"data:")]
            if data:
                events.append(b"\n".join(data))
                self._note(events[-1])
        return events

    def _note(self, event: bytes) -> None:
        if event.startswith(b'{"type":"response.completed"'):
            response = _json(event).get("response")
            if isinstance(response, dict) and isinstance(response.get("id"), str):
                self.response_id = response["id"]


def _create_body(message: Message) -> dict[str, Any] | None:
    """The create body a ``response.create`` frame carries (``stream`` implicit); None for an
    acknowledgement, which needs no answer."""
    text = message.get("text")
    if text is None:
        raise InvalidRequest("frames must be JSON text, not binary")
    try:
        frame = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"frame is not valid JSON: {exc}") from exc
    if isinstance(frame, dict) and frame.get("type") == PROCESSED:
        return None
    if not isinstance(frame, dict) or frame.get("type") != CREATE:
        kind = frame.get("type") if isinstance(frame, dict) else None
        raise InvalidRequest(f"unsupported client event {kind!r}: send {CREATE!r} frames")
    if frame.get("background") is not None:
        raise InvalidRequest("background is not supported over WebSocket")
    body = {k: v for k, v in frame.items() if k != "type"}
    body["stream"] = True
    return body


def _items(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        return value
    raise InvalidRequest("input must be a string or an array of items")


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"message": raw.decode(errors="replace")}


async def _refuse(websocket: WebSocket, err: GatewayError, provider: Any) -> None:
    """Refuse the upgrade: the HTTP status and the provider's error body where the server can
    send one (uvicorn can), else a policy close."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        body = orjson.dumps(provider.error_body(err))
        await websocket.send_denial_response(
            Response(body, status_code=err.status, media_type="application/json")
        )
        return
    await websocket.close(POLICY_CLOSE, err.message[:120])
