"""One session's view of the gateway: its model API and nothing else.

A sandbox reaches the gateway only through this view (the runtime's relay serves it on the
socket bound into the sandbox). It admits the registered providers' routes (their
``api_roots``: ``/v1/...``, ``/v1beta/...``, ``/v1alpha/...`` today) and a POST to the bare
base URL (body-detected), each with or without the ``/s/<key>`` prefix, and hands them to the gateway as ``/s/<own key>/<rest>``: whatever the
harness sends, the call is attributed to its own session. Everything else is answered here,
before the gateway sees the request (its body unread):

- a ``/s/<key>`` prefix, an API key header (``Authorization: Bearer`` or a provider's
  ``key_headers``: ``x-api-key``, ``x-goog-api-key``) or a ``?key=`` naming any other key: 403;
- ``/polar/*`` (admin, node), ``/health``, ``/docs``, ``/openapi.json``, ``/redoc``, any other
  path, and paths with ``.``/``..`` segments: 404;
- a websocket (OpenAI Responses' WebSocket mode) is narrowed as a request is, and a refused one
  closed with 1008 before its upgrade completes; any other scope: closed.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qsl, quote

import orjson
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from polar.errors import ModelApiRefused as Refusal
from polar.gateway.sessions import SESSION_PREFIX, split_session_prefix
from polar.providers.registry import routing_table

# The base URL itself: the gateway detects the provider from headers or body (POST only).
BARE_PATHS = frozenset({"", "/"})
# Characters kept literal when the rewritten path is re-encoded for raw_path.
_PATH_SAFE = "/:@!$&'()*+,;=~"


def own_path(method: str, path: str, own_key: str) -> str:
    """``path`` rewritten under ``/s/<own_key>``, or :class:`Refusal` if it is not the model
    API or names another session."""
    key, rest = split_session_prefix(path)
    prefixed = path.startswith(SESSION_PREFIX) or path == SESSION_PREFIX.rstrip("/")
    if prefixed and key != own_key:
        raise Refusal(403, "permission_error", "this sandbox may use its own session only")
    segments = rest.split("/")
    if "." in segments or ".." in segments:
        raise Refusal(404, "not_found_error", "dot segments are not served here")
    bare = rest in BARE_PATHS and method == "POST"
    roots = routing_table().api_roots
    if not bare and not any(rest == root or rest.startswith(root + "/") for root in roots):
        raise Refusal(404, "not_found_error", f"only the model API is served here, not {path}")
    return f"{SESSION_PREFIX}{own_key}{rest}"


def check_keys(headers: list[tuple[bytes, bytes]], query_string: bytes, own_key: str) -> None:
    """:class:`Refusal` when a header or query parameter names a key other than ``own_key``."""
    named: list[str] = []
    key_headers = {name.encode("latin-1") for name in routing_table().key_headers}
    for name, value in headers:
        text = value.decode("latin-1").strip()
        if name == b"authorization" and text[:7].lower() == "bearer ":
            named.append(text[7:].strip())
        elif name in key_headers:
            named.append(text)
    named += [value for name, value in parse_qsl(query_string.decode("latin-1")) if name == "key"]
    if any(key != own_key for key in named):
        raise Refusal(403, "permission_error", "this sandbox may use its own session key only")


class ModelApiView:
    """The ASGI app a sandbox reaches: ``app`` (the gateway) narrowed to ``session_id``."""

    def __init__(self, app: ASGIApp, session_id: str) -> None:
        self.app = app
        self.session_id = session_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return
        try:
            path = own_path(scope.get("method", "GET"), scope["path"], self.session_id)
            check_keys(scope["headers"], scope.get("query_string", b""), self.session_id)
        except Refusal as refusal:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008, "reason": refusal.message})
            else:
                await _answer(refusal)(scope, receive, send)
            return
        scope = {
            **scope,
            "path": path,
            "raw_path": quote(path, safe=_PATH_SAFE).encode("ascii"),
            "root_path": "",
        }
        await self.app(scope, receive, send)


def model_api_views(app: ASGIApp) -> Callable[[str], ModelApiView]:
    """A factory of per-session views of ``app`` (what a node hands to each runtime)."""
    return lambda session_id: ModelApiView(app, session_id)


def _answer(refusal: Refusal) -> Response:
    body = orjson.dumps({"error": {"type": refusal.kind, "message": refusal.message}})
    return Response(body, status_code=refusal.status, media_type="application/json")
