"""Carry TCP connections across a sandbox's network boundary through a unix socket.

A sandbox with no network but loopback must still reach the gateway. Outside, the runtime
listens on a unix socket and connects each client to the gateway's host:port
(:func:`serve_unix_to_tcp`). Inside, this module listens on ``127.0.0.1:PORT`` and pipes each
connection to that socket, which is bound into the sandbox. It uses only the standard library so
any Python 3 inside a sandbox can run it as a plain script::

    python forwarder.py --tcp 127.0.0.1:PORT --unix /path/sock [-- command args...]

With a command, the port is bound first, the forwarder moves to the background, and the command
is exec'd in place of this process: connections the command makes wait in the listen backlog,
so there is no start-up race, and the forwarder exits once the command is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence

_CHUNK = 64 * 1024
_WATCH_INTERVAL_S = 0.2

Opener = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one direction until EOF, then half-close so the peer sees the end of the request."""
    try:
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def _splicer(
    open_upstream: Opener,
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def splice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await open_upstream()
        except OSError:
            await _close(writer)
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            await _close(up_writer)
            await _close(writer)

    return splice


async def serve_unix_to_tcp(unix_path: str, host: str, port: int) -> asyncio.AbstractServer:
    """Listen on ``unix_path`` and connect each client to ``host:port`` (the runtime's side)."""
    server = await asyncio.start_unix_server(
        _splicer(lambda: asyncio.open_connection(host, port)), path=unix_path
    )
    # Containers may run their processes as another uid; the socket sits in a private dir.
    os.chmod(unix_path, 0o666)
    return server


async def serve_tcp_to_unix(
    sock: socket.socket, unix_path: str, watch_pid: int | None = None
) -> None:
    """Accept on a bound TCP socket and pipe each connection to ``unix_path`` (the sandbox side).

    Runs until ``watch_pid`` is gone, or forever when it is None.
    """
    server = await asyncio.start_server(
        _splicer(lambda: asyncio.open_unix_connection(unix_path)), sock=sock
    )
    async with server:
        if watch_pid is None:
            await server.serve_forever()
        else:
            while _alive(watch_pid):
                await asyncio.sleep(_WATCH_INTERVAL_S)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def parse_hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def _serve_in_background(sock: socket.socket, unix_path: str, watch_pid: int) -> None:
    """Double-fork so the forwarder is not a child of the command (a shell's ``wait`` must not
    wait for it), drop the command's stdio, and serve until the command exits."""
    if os.fork():
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        asyncio.run(serve_tcp_to_unix(sock, unix_path, watch_pid))
    finally:
        os._exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in args:
        split = args.index("--")
        args, command = args[:split], args[split + 1 :]
    parser = argparse.ArgumentParser(prog="forwarder", description=__doc__.splitlines()[0])
    parser.add_argument("--tcp", required=True, help="HOST:PORT to listen on")
    parser.add_argument("--unix", required=True, help="unix socket to forward to")
    opts = parser.parse_args(args)
    host, port = parse_hostport(opts.tcp)
    sock = socket.create_server((host, port), backlog=128)
    if not command:
        asyncio.run(serve_tcp_to_unix(sock, opts.unix))
        return 0
    me = os.getpid()
    child = os.fork()
    if child == 0:
        _serve_in_background(sock, opts.unix, me)
    os.waitpid(child, 0)
    sock.close()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"{command[0]}: {exc.strerror}", file=sys.stderr)
        return 126 if isinstance(exc, PermissionError) else 127


if __name__ == "__main__":
    sys.exit(main())
