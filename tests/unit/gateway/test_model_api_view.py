"""The per-session model-API view: what it admits, what it refuses, and how it rewrites."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from polar.gateway.model_api_view import ModelApiView, Refusal, own_path

OWN = "sess-own"
OTHER = "sess-other"


class Recorder:
    """A stand-in gateway: answers 200 with the path it was given, and counts its calls."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.seen.append(scope)
        body = scope["path"].encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
def gateway() -> Recorder:
    return Recorder()


async def call(gateway: Recorder, method: str, path: str, **kwargs: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=ModelApiView(gateway, OWN))
    async with httpx.AsyncClient(transport=transport, base_url="http://sandbox") as client:
        return await client.request(method, path, **kwargs)


ADMITTED = [
    ("POST", "/v1/chat/completions", f"/s/{OWN}/v1/chat/completions"),
    ("POST", f"/s/{OWN}/v1/chat/completions", f"/s/{OWN}/v1/chat/completions"),
    ("POST", f"/s/{OWN}/v1/messages", f"/s/{OWN}/v1/messages"),
    ("POST", "/v1/responses", f"/s/{OWN}/v1/responses"),
    ("GET", "/v1/models", f"/s/{OWN}/v1/models"),
    (
        "POST",
        f"/s/{OWN}/v1beta/models/m:generateContent",
        f"/s/{OWN}/v1beta/models/m:generateContent",
    ),
    ("POST", "/v1alpha/models/m:countTokens", f"/s/{OWN}/v1alpha/models/m:countTokens"),
    ("POST", "/v1", f"/s/{OWN}/v1"),
    ("POST", "/", f"/s/{OWN}/"),
    ("POST", f"/s/{OWN}", f"/s/{OWN}"),
]


@pytest.mark.parametrize(("method", "path", "forwarded"), ADMITTED)
async def test_model_api_routes_reach_the_gateway_under_the_own_key(
    gateway: Recorder, method: str, path: str, forwarded: str
) -> None:
    reply = await call(gateway, method, path, headers={"authorization": f"Bearer {OWN}"})
    assert reply.status_code == 200, reply.text
    assert reply.text == forwarded
    assert gateway.seen[0]["raw_path"] == forwarded.encode()


async def test_the_query_string_and_own_key_headers_pass(gateway: Recorder) -> None:
    reply = await call(
        gateway,
        "POST",
        f"/v1beta/models/m:streamGenerateContent?alt=sse&key={OWN}",
        headers={"x-goog-api-key": OWN, "x-api-key": OWN},
    )
    assert reply.status_code == 200
    assert gateway.seen[0]["query_string"] == f"alt=sse&key={OWN}".encode()


REFUSED_PATHS = [
    ("GET", "/polar/sessions", 404),
    ("POST", "/polar/admin/pause", 404),
    ("POST", "/polar/node/sessions", 404),
    ("GET", "/polar/node/status", 404),
    ("GET", "/docs", 404),
    ("GET", "/openapi.json", 404),
    ("GET", "/redoc", 404),
    ("GET", "/health", 404),
    ("GET", "/", 404),
    ("GET", "/anything", 404),
    ("GET", f"/s/{OWN}/polar/sessions", 404),
    ("GET", f"/s/{OWN}/health", 404),
    ("POST", f"/s/{OTHER}/v1/chat/completions", 403),
    ("GET", f"/s/{OTHER}/v1/models", 403),
    ("POST", "/s/", 403),
    ("POST", "/s", 403),
    ("POST", f"/s/{OWN}x/v1/messages", 403),
]


@pytest.mark.parametrize(("method", "path", "status"), REFUSED_PATHS)
async def test_everything_else_is_refused_before_the_gateway(
    gateway: Recorder, method: str, path: str, status: int
) -> None:
    reply = await call(gateway, method, path)
    assert reply.status_code == status
    error = reply.json()["error"]
    assert error["type"] == ("permission_error" if status == 403 else "not_found_error")
    assert error["message"]
    assert gateway.seen == []


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        ({"authorization": f"Bearer {OTHER}"}, ""),
        ({"authorization": f"bearer {OTHER}"}, ""),
        ({"x-api-key": OTHER}, ""),
        ({"x-goog-api-key": OTHER}, ""),
        ({}, f"?key={OTHER}"),
        ({"authorization": f"Bearer {OWN}", "x-api-key": OTHER}, ""),
        ({"authorization": f"Bearer {OWN}"}, f"?key={OWN}&key={OTHER}"),
    ],
)
async def test_another_key_in_a_header_or_the_query_is_refused(
    gateway: Recorder, headers: dict[str, str], query: str
) -> None:
    reply = await call(gateway, "POST", f"/s/{OWN}/v1/chat/completions{query}", headers=headers)
    assert reply.status_code == 403
    assert reply.json()["error"]["type"] == "permission_error"
    assert gateway.seen == []


async def test_a_refused_request_body_is_never_read(gateway: Recorder) -> None:
    read: list[bool] = []
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        read.append(True)
        return {"type": "http.request", "body": b"x", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/polar/node/sessions",
        "headers": [],
        "query_string": b"",
    }
    await ModelApiView(gateway, OWN)(scope, receive, send)
    assert sent[0]["status"] == 404
    assert read == []


@pytest.mark.parametrize(
    "path", ["/v1/../polar/sessions", f"/s/{OWN}/v1/./chat/completions", "/v1beta/.."]
)
def test_dot_segments_are_refused(path: str) -> None:
    # HTTP clients normalize these away; a raw request line can still carry them.
    with pytest.raises(Refusal) as refused:
        own_path("POST", path, OWN)
    assert refused.value.status == 404


async def upgrade(gateway: Recorder, path: str, headers: list[tuple[bytes, bytes]]) -> list[Any]:
    """A websocket scope through the view: what came back (a refusal's close, or the stand-in
    gateway's answer)."""
    scope = {"type": "websocket", "path": path, "headers": headers, "query_string": b""}
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "websocket.connect"}

    await ModelApiView(gateway, OWN)(scope, receive, send)
    return sent


async def test_a_websocket_is_narrowed_as_a_request_is(gateway):
    own = [(b"authorization", f"Bearer {OWN}".encode())]
    await upgrade(gateway, "/v1/responses", own)
    assert gateway.seen[-1]["path"] == f"/s/{OWN}/v1/responses"
    assert gateway.seen[-1]["type"] == "websocket"
    for path, headers in [
        ("/v1/responses", [(b"authorization", f"Bearer {OTHER}".encode())]),
        (f"/s/{OTHER}/v1/responses", own),
        ("/polar/sessions", own),
    ]:
        closed = await upgrade(gateway, path, headers)
        assert closed[0]["type"] == "websocket.close" and closed[0]["code"] == 1008, path
    assert len(gateway.seen) == 1
