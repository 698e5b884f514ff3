"""HTTP hardening (issue 14.5) against a real uvicorn server on loopback: idle sockets do not
stop service, a request must arrive in time, and an unauthenticated body is refused before it
is read."""

from __future__ import annotations

import re
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.capture.store import CaptureStore
from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.server import BackgroundServer
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig
from polar.serving import ServerLimits

TOKEN = "test-admin-token"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
IDLE_SOCKETS = 1100
THIRTY_MB = 30 * 1024 * 1024


@pytest.fixture(scope="module", autouse=True)
def enough_file_descriptors() -> None:
    """Both ends of every idle socket live in this process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * IDLE_SOCKETS + 512
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"the fd limit ({hard}) is below the {needed} this test needs")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def serve(tmp_path: Path, tokenizer: Any, limits: ServerLimits, **config: Any) -> BackgroundServer:
    cfg = GatewayConfig(capture_db=tmp_path / "c.db", admin_token=TOKEN, **config)
    engine = ScriptedEngine(ScriptedBackend(Script(), tokenizer=tokenizer))
    app = create_app(cfg, engine=engine, store=CaptureStore(cfg.capture_db))
    return BackgroundServer(app, limits=limits).start()


@pytest.fixture
def gateway(tmp_path: Path, tokenizer: Any) -> Iterator[BackgroundServer]:
    server = serve(tmp_path, tokenizer, ServerLimits())
    yield server
    server.stop()


def new_session(server: BackgroundServer) -> str:
    reply = httpx.post(
        f"{server.url}/polar/sessions", json={}, headers={"authorization": f"Bearer {TOKEN}"}
    )
    reply.raise_for_status()
    return str(reply.json()["session_id"])


def call(server: BackgroundServer, key: str) -> httpx.Response:
    return httpx.post(f"{server.url}/s/{key}/v1/chat/completions", json=CHAT, timeout=10.0)


def test_1100_idle_connections_do_not_stop_a_legitimate_call(
    gateway: BackgroundServer,
) -> None:
    key = new_session(gateway)
    idle = []
    try:
        for i in range(IDLE_SOCKETS):
            sock = socket.create_connection(("127.0.0.1", gateway.port))
            if i % 2:  # half silent, half stuck in the middle of a request line (slowloris)
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            idle.append(sock)
        time.sleep(0.2)  # let the server accept them all
        open_now = len(gateway.server.server_state.connections)
        assert open_now <= ServerLimits().max_connections  # the longest idle were displaced
        started = time.monotonic()
        reply = call(gateway, key)
        took = time.monotonic() - started
        assert reply.status_code == 200, reply.text
        print(
            f"\n{IDLE_SOCKETS} idle sockets ({open_now} held): a call answered in {took * 1e3:.0f} ms"
        )
        assert took < 3.0
    finally:
        for sock in idle:
            sock.close()


def test_a_request_that_does_not_arrive_in_time_is_cut_off(tmp_path: Path, tokenizer: Any) -> None:
    limits = ServerLimits(header_timeout_s=0.3, body_timeout_s=0.6)
    server = serve(tmp_path, tokenizer, limits)
    try:
        key = new_session(server)
        silent = socket.create_connection(("127.0.0.1", server.port))
        slow_headers = socket.create_connection(("127.0.0.1", server.port))
        slow_headers.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
        slow_body = socket.create_connection(("127.0.0.1", server.port))
        slow_body.sendall(
            f"POST /s/{key}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode()
        )
        for sock, limit in [(silent, 0.3), (slow_headers, 0.3), (slow_body, 0.6)]:
            sock.settimeout(5.0)
            started = time.monotonic()
            assert sock.recv(1024) == b""  # closed by the server, nothing answered
            assert time.monotonic() - started < limit + 1.0
            sock.close()
        assert call(server, key).status_code == 200
    finally:
        server.stop()


def send_until_refused(sock: socket.socket, total: int) -> int:
    """Send up to ``total`` bytes of body; how many the kernel took before the server closed."""
    chunk = b" " * 65536
    sent = 0
    sock.settimeout(2.0)
    try:
        while sent < total:
            sent += sock.send(chunk[: total - sent])
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        pass
    return sent


def headers_then_answer(server: BackgroundServer, head: str) -> tuple[bytes, float, int]:
    """Send only ``head``, read the answer (the body is never sent first), then try the body."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.settimeout(5.0)
    started = time.monotonic()
    sock.sendall(head.encode())
    answer = sock.recv(65536)
    took = time.monotonic() - started
    sent = send_until_refused(sock, THIRTY_MB)
    sock.close()
    return answer, took, sent


def test_an_unauthenticated_30mb_body_is_refused_before_it_is_read(
    gateway: BackgroundServer,
) -> None:
    for head in [
        # No key, then an unknown one: 401 in the caller's provider shape, body unread.
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {THIRTY_MB}\r\n\r\n",
        "POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: nobody\r\n"
        f"Content-Type: application/json\r\nContent-Length: {THIRTY_MB}\r\n\r\n",
    ]:
        answer, took, sent = headers_then_answer(gateway, head)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        print(f"\n{head.split()[1]}: 401 in {took * 1000:.0f} ms, {sent} body bytes taken")
        assert took < 2.0
        assert sent < THIRTY_MB // 2  # what the kernel's buffers took; the server closed


def test_an_unauthenticated_30mb_body_is_refused_before_it_is_read_on_control_routes(
    gateway: BackgroundServer, tmp_path: Path
) -> None:
    """The admin and node API and the rollout server check the token before any body."""
    config = RolloutServerConfig(data_dir=tmp_path / "rollout", admin_token=TOKEN)
    rollout = BackgroundServer(create_rollout_app(config)).start()
    try:
        for server, path in [
            (gateway, "/polar/sessions"),
            (gateway, "/polar/node/sessions"),
            (rollout, "/tasks"),
            (rollout, "/nodes/register"),
            (rollout, "/results"),
        ]:
            head = (
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {THIRTY_MB}\r\n\r\n"
            )
            answer, took, sent = headers_then_answer(server, head)
            assert answer.startswith(b"HTTP/1.1 401"), (path, answer[:200])
            print(f"\n{path}: 401 in {took * 1000:.0f} ms, {sent} body bytes taken")
            assert took < 2.0
            assert sent < THIRTY_MB // 2
    finally:
        rollout.stop()


def test_a_body_over_the_limit_is_refused_in_the_callers_shape(
    tmp_path: Path, tokenizer: Any
) -> None:
    server = serve(tmp_path, tokenizer, ServerLimits(), max_body_bytes=1 << 20)
    try:
        key = new_session(server)
        declared = (
            f"POST /s/{key}/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            f"\r\nContent-Length: {THIRTY_MB}\r\n\r\n"
        )
        answer, took, _ = headers_then_answer(server, declared)
        assert answer.startswith(b"HTTP/1.1 413") and b'"type":"error"' in answer, answer
        assert took < 2.0
        # Chunked, so no length is declared: cut off once the limit is passed.
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(
            f"POST /s/{key}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        )
        piece = b" " * 65536
        frame = b"%x\r\n" % len(piece) + piece + b"\r\n"
        sent = send_until_refused_framed(sock, frame, THIRTY_MB)
        sock.settimeout(5.0)
        answer = sock.recv(65536)
        sock.close()
        print(f"\nchunked: refused after {sent} bytes sent (limit {1 << 20})")
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert sent < THIRTY_MB // 2
    finally:
        server.stop()


def send_until_refused_framed(sock: socket.socket, frame: bytes, total: int) -> int:
    sent = 0
    sock.settimeout(2.0)
    try:
        while sent < total:
            sock.sendall(frame)
            sent += len(frame)
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        pass
    return sent


def _serve_gateway_under(nofile: int, tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    """``polar serve-gateway`` (scripted engine, sessions by key) in a process whose descriptor
    limit is ``nofile``, soft and hard, as under ``ulimit -n``; its port."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    args = ["--engine", "scripted", "--port", "0", "--auto-register"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from polar.cli.main import main; raise SystemExit(main())",
            "serve-gateway",
            *args,
            "--capture-db",
            str(tmp_path / "c.db"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=limit,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r"Polar gateway on http://127\.0\.0\.1:(\d+)", line)
        if found:
            return proc, int(found.group(1))
    raise AssertionError(f"the gateway did not start (exit {proc.wait()})")


def test_1100_idle_sockets_under_ulimit_1024_leave_real_calls_working(tmp_path: Path) -> None:
    proc, port = _serve_gateway_under(1024, tmp_path)
    idle = []
    try:
        for i in range(IDLE_SOCKETS):
            sock = socket.create_connection(("127.0.0.1", port))
            if i % 2:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            idle.append(sock)
        time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/s/ps-{'k' * 32}/v1/chat/completions"
        started = time.monotonic()
        replies = [httpx.post(url, json=CHAT, timeout=10.0) for _ in range(5)]
        took = time.monotonic() - started
        assert [r.status_code for r in replies] == [200] * 5, replies[-1].text
        # No time bound beyond each call's own 10 s timeout: on 2 shared cores (CI runs two
        # test workers) 5 calls took 9 s; what this guards is that they are served at all.
        print(f"\nulimit 1024, {IDLE_SOCKETS} idle sockets: 5 calls in {took * 1e3:.0f} ms")
    finally:
        for sock in idle:
            sock.close()
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "Too many open files" not in out, out[-2000:]


@pytest.mark.parametrize(
    "headers",
    [
        "x-big: " + "a" * 40_000 + "\r\n",
        "x-big: " + "a" * 100_000 + "\r\n",
        "".join(f"x-h{i}: v\r\n" for i in range(5000)),
    ],
    ids=["40KB", "100KB", "5000-headers"],
)
def test_headers_over_the_limit_are_a_400_even_in_one_read(
    gateway: BackgroundServer, headers: str
) -> None:
    key = new_session(gateway)
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    head = (
        f"POST /s/{key}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n{headers}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", gateway.port))
    sock.settimeout(5.0)
    sock.sendall(head.encode() + body)  # one write: the server may read it all at once
    answer = sock.recv(65536)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert call(gateway, key).status_code == 200  # and the server goes on serving


def test_a_pipelined_request_over_the_header_limit_is_a_400(gateway: BackgroundServer) -> None:
    """The second of two requests sent in one write waits in h11's buffer while the first is
    answered; before, its head was never counted and 40 KB of headers got a 200."""
    key = new_session(gateway)
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'

    def request(extra: str) -> bytes:
        head = (
            f"POST /s/{key}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n{extra}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    sock = socket.create_connection(("127.0.0.1", gateway.port))
    sock.settimeout(5.0)
    sock.sendall(request("") + request("x-big: " + "a" * 40_000 + "\r\n"))
    answer = b""
    while chunk := sock.recv(65536):  # until the server closes the connection
        answer += chunk
    sock.close()
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert statuses == [b"200", b"400"], answer[-400:]
    assert b"exceed 32768 bytes" in answer
    assert call(gateway, key).status_code == 200
