"""The gateway forwarder: both halves on real sockets, and its exec-a-command mode."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from polar.runtimes.forwarder import parse_hostport, serve_tcp_to_unix, serve_unix_to_tcp
from polar.runtimes.gateway_relay import GatewayRelay

FORWARDER = Path(sys.modules["polar.runtimes.forwarder"].__file__ or "")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
async def echo_server() -> AsyncIterator[tuple[str, int]]:
    """Echoes everything until the client half-closes, then closes."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    async with server:
        yield "127.0.0.1", server.sockets[0].getsockname()[1]


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="polar-t-") as path:  # short: sun_path is 108 bytes
        yield Path(path)


async def test_both_halves_carry_a_megabyte_each_way_with_half_close(echo_server, sock_dir):
    host, port = echo_server
    unix = str(sock_dir / "gw.sock")
    outside = await serve_unix_to_tcp(unix, host, port)
    listener = socket.create_server(("127.0.0.1", 0))
    inside_port = listener.getsockname()[1]
    inside = asyncio.create_task(serve_tcp_to_unix(listener, unix))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", inside_port)
        payload = os.urandom(1 << 20)
        writer.write(payload)
        writer.write_eof()
        received = await asyncio.wait_for(reader.read(), 10)
        assert received == payload
        writer.close()
    finally:
        inside.cancel()
        outside.close()


async def test_relay_reports_the_inside_url_and_uses_a_short_socket_path(gateway_url, tmp_path):
    deep = tmp_path / ("d" * 120)
    relay = GatewayRelay(gateway_url, deep, port_inside=18123)
    assert relay.url_inside == "http://127.0.0.1:18123/gw"
    await relay.start()
    try:
        assert len(str(relay.host_dir)) < 90 and (relay.host_dir / "gateway.sock").exists()
    finally:
        await relay.stop()
    assert not relay.host_dir.exists()


async def test_exec_mode_serves_the_command_then_exits(gateway_url, sock_dir):
    relay = GatewayRelay(gateway_url, sock_dir)
    await relay.start()
    port = free_port()
    fetch = (
        "import urllib.request;"
        f"print(urllib.request.urlopen('http://127.0.0.1:{port}/gw/hello').read().decode())"
    )
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(FORWARDER),
            "--tcp",
            f"127.0.0.1:{port}",
            "--unix",
            str(sock_dir / "gateway.sock"),
            "--",
            sys.executable,
            "-c",
            fetch,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == 0
        assert out.decode().strip() == "gateway /gw/hello"
        for _ in range(50):  # the background forwarder notices the command is gone
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except ConnectionRefusedError:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("forwarder kept listening after its command exited")
    finally:
        await relay.stop()


async def test_exec_mode_reports_a_missing_command(sock_dir):
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(FORWARDER),
        "--tcp",
        f"127.0.0.1:{free_port()}",
        "--unix",
        str(sock_dir / "none.sock"),
        "--",
        "/no/such/cmd",
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 127 and b"/no/such/cmd" in err


def test_parse_hostport():
    assert parse_hostport("127.0.0.1:8080") == ("127.0.0.1", 8080)
    for bad in ("8080", "host:", "host:x"):
        with pytest.raises(ValueError):
            parse_hostport(bad)


async def test_a_sandbox_flooding_its_relay_with_silent_sockets_still_gets_answers(tmp_path):
    """The relay that serves a session's model API bounds what one harness can hold: beyond
    its connection cap a new connection displaces the idle ones, so the harness's own call (or
    any other) is still answered."""
    from polar.runtimes.gateway_relay import SANDBOX_LIMITS, SOCKET_NAME

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    relay = GatewayRelay("http://127.0.0.1:9", tmp_path / "run", model_api=app)
    await relay.start()
    silent = []
    try:
        path = str(relay.host_dir / SOCKET_NAME)
        for _ in range(SANDBOX_LIMITS.max_connections + 36):
            silent.append(await asyncio.open_unix_connection(path))
        await asyncio.sleep(0.3)
        dropped = sum(reader.at_eof() for reader, _ in silent)
        assert dropped >= 36  # the relay holds at most its cap, whatever the harness opens
        transport = httpx.AsyncHTTPTransport(uds=path)
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            reply = await client.get("http://sandbox/v1/models")
        assert reply.status_code == 200 and reply.text == "ok"
    finally:
        for _, writer in silent:
            writer.close()
        await relay.stop()
