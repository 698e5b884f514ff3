"""Fixtures for runtime tests: tiny real HTTP servers on the host's loopback."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator

import pytest


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers every GET with its server's name and the path it saw."""

    def do_GET(self) -> None:
        body = f"{self.server.label} {self.path}".encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _serve(label: str) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.label = label  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def gateway_url() -> Iterator[str]:
    """A stand-in gateway: ``GET /gw/x`` answers ``gateway /gw/x``."""
    with _serve("gateway") as url:
        yield f"{url}/gw"


@pytest.fixture(scope="session")
def other_server_url() -> Iterator[str]:
    """Another host loopback service a sandbox must not reach."""
    with _serve("other") as url:
        yield url
