"""Bearer tokens checked before an app sees the request: a plain ASGI middleware.

FastAPI reads a request's body before it solves a route's dependencies, so a check written as a
dependency would let anyone make the server read a 30 MB body first. This middleware answers
401 from the headers alone. Which token a path needs is the app's decision (``authorize``); the
caller it admits (a "principal") is left in ``scope["state"]["principal"]`` for the routes that
need to know who it is (a node posting a result, say).

A browser cannot set headers on a page load or an ``EventSource``: a guard given a ``cookie``
name also takes the token from that cookie when no header carries one, for GET and HEAD only, so
no request that changes anything is ever admitted on a cookie a browser sent by itself (the
rollout server's dashboard keeps its read-only viewer token there).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

# path, bearer token (None when none was sent) -> the admitted principal, OPEN, or None (401)
Authorize = Callable[[str, str | None], Any]
OPEN = "open"


def bearer(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The token in ``Authorization: Bearer`` or ``x-polar-admin-token``, if any."""
    for name, value in headers:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            return value[7:].strip().decode("latin-1") or None
        if name == b"x-polar-admin-token":
            return value.strip().decode("latin-1") or None
    return None


def cookie(headers: Iterable[tuple[bytes, bytes]], name: str) -> str | None:
    """The value of cookie ``name`` in the request's ``Cookie`` headers, if any."""
    wanted = name.encode("latin-1")
    for header, value in headers:
        if header != b"cookie":
            continue
        for pair in value.split(b";"):
            key, _, found = pair.strip().partition(b"=")
            if key == wanted and found:
                return found.decode("latin-1")
    return None


def same_secret(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison; nothing matches a missing secret."""
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


class TokenGuard:
    """Refuses HTTP requests ``authorize`` does not admit with 401, before the body is read."""

    def __init__(
        self, app: ASGIApp, authorize: Authorize, *, realm: str, cookie: str | None = None
    ) -> None:
        self.app = app
        self.authorize = authorize
        self.realm = realm
        self.cookie = cookie

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = bearer(scope["headers"])
        if token is None and self.cookie is not None and scope["method"] in ("GET", "HEAD"):
            token = cookie(scope["headers"], self.cookie)
        principal = self.authorize(scope["path"], token)
        if principal is None:
            await _unauthorized(self.realm)(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


def _unauthorized(realm: str) -> Response:
    body = orjson.dumps({"detail": f"{realm} required: send it as 'Authorization: Bearer <token>'"})
    return Response(
        body,
        status_code=401,
        media_type="application/json",
        headers={"www-authenticate": "Bearer", "connection": "close"},
    )
