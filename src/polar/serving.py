"""How both servers (gateway, rollout server) meet the network: limits on connections and on
the time a request may take to arrive, applied in one place to every way a server is started.

uvicorn bounds idle keep-alive time and header size, but a connection that never sends a
request holds its socket forever, and its ``limit_concurrency`` answers 503 to everyone once
idle sockets reach it. :func:`guarded_protocol` closes that gap: a request's line and headers
must arrive within ``header_timeout_s``, its body within ``body_timeout_s``, and beyond
``max_connections`` a new connection displaces the one idle longest (none with a request in
progress), so a flood of silent sockets never stops a legitimate call.

The connection cap is worth nothing if the descriptors run out first: a flood then costs the
engine pool, the store and sandboxes their ``open()`` (``Too many open files``). So the
soft descriptor limit is raised to the hard one at start, and the cap and the accept burst
are derived from it (:func:`connection_cap`). h11 bounds the headers only while they arrive
in pieces; :class:`_GuardedH11Protocol` counts them itself, so ``max_header_bytes`` holds
when they arrive in one read too, and for a pipelined request that arrived with the one before.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import resource
import socket
from typing import Any

import h11
import uvicorn
from pydantic import BaseModel, ConfigDict, Field
from uvicorn.protocols.http.h11_impl import H11Protocol


class ServerLimits(BaseModel):
    """What a caller's connection may hold of a server, and for how long."""

    model_config = ConfigDict(extra="forbid")

    max_connections: int = Field(
        1024,
        ge=1,
        description="Open connections; beyond them a new one displaces the connection idle "
        "longest (no request in progress), or is closed if every one is busy.",
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="From connect (or a request's first byte) to its last header."
    )
    body_timeout_s: float = Field(
        120.0, gt=0, description="From a request's headers to the last byte of its body."
    )
    keep_alive_s: int = Field(
        5, ge=1, description="Idle time between requests before a connection is closed."
    )
    max_header_bytes: int = Field(
        32 * 1024, ge=1024, description="Request line and headers, together."
    )
    backlog: int = Field(2048, ge=1, description="Connections waiting to be accepted.")
    reserved_fds: int = Field(
        128,
        ge=0,
        description="Descriptors kept from the connection cap for the store, logs and "
        "sandboxes (the engine pool's are counted apart: one per connection).",
    )


def raise_descriptor_limit() -> int:
    """The soft RLIMIT_NOFILE raised to the hard one (many systems start processes at 1024
    with a far higher hard limit); the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def connection_cap(limits: ServerLimits, descriptors: int) -> int:
    """The connections a server holds when ``descriptors`` may be open: ``max_connections``,
    but at most what leaves ``reserved_fds`` free and one engine connection per client one (a
    call in flight holds both)."""
    if descriptors == resource.RLIM_INFINITY:
        return limits.max_connections
    return max(1, min(limits.max_connections, (descriptors - limits.reserved_fds) // 2))


def serve(
    app: Any, *, host: str, port: int, limits: ServerLimits, sock: socket.socket | None = None
) -> None:
    """Run ``app`` until interrupted (the ``polar serve-*`` commands), under ``limits``; on
    ``sock`` when the caller bound it already (its real port known before the app starts)."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        # uvicorn's own lines go through the process's logging (polar.logs: JSON or text).
        log_config=None,
        access_log=False,
        **uvicorn_settings(limits),
    )
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock] if sock is not None else None)
    if not server.started:
        raise SystemExit(3)  # uvicorn.run's exit status when a server fails to start


def uvicorn_settings(limits: ServerLimits) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run`` / ``uvicorn.Config`` that apply ``limits`` (the
    process's soft descriptor limit raised first: see :func:`raise_descriptor_limit`)."""
    descriptors = raise_descriptor_limit()
    cap = connection_cap(limits, descriptors)
    return {
        "http": guarded_protocol(limits, cap),
        "timeout_keep_alive": limits.keep_alive_s,
        "h11_max_incomplete_event_size": limits.max_header_bytes,
        "backlog": accept_burst(limits, descriptors, cap),
    }


def accept_burst(limits: ServerLimits, descriptors: int, cap: int) -> int:
    """The listen backlog: the event loop accepts up to that many sockets in one go before any
    of them can displace an idle one, so the burst must fit in what ``cap`` leaves free."""
    if descriptors == resource.RLIM_INFINITY:
        return limits.backlog
    return max(1, min(limits.backlog, (descriptors - 2 * cap) // 2))


def guarded_protocol(limits: ServerLimits, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with ``limits``' read deadlines and header size, holding at most
    ``max_connections``."""

    class GuardedH11Protocol(_GuardedH11Protocol):
        pass

    GuardedH11Protocol.limits = limits
    GuardedH11Protocol.max_connections = max_connections
    return GuardedH11Protocol


# Where a request's head ends; h11 accepts a bare LF as a line end too.
_HEAD_END = re.compile(rb"\n\r?\n")


class _GuardedH11Protocol(H11Protocol):
    limits: ServerLimits
    max_connections: int

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._reading_body = False
        self._head_bytes = 0
        self._head_tail = b""
        self.idle_since = self.loop.time()
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            idle = [
                c
                for c in self.connections
                if isinstance(c, _GuardedH11Protocol) and c is not self and c.idle()
            ]
            victim = min(idle, key=lambda c: c.idle_since) if idle else self
            victim.transport.close()
            if victim is not self:
                victim.connections.discard(victim)
            else:
                self.connections.discard(self)
                return
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and self._head_too_large(data):
            self._refuse_head()
            return
        super().data_received(data)
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            if self._deadline is None:  # the first byte of a request after a keep-alive wait
                self._arm(self.limits.header_timeout_s)
            return
        self._head_bytes, self._head_tail = 0, b""
        if state is h11.SEND_BODY:
            if not self._reading_body:
                self._arm(self.limits.body_timeout_s)
                self._reading_body = True
        else:
            self._disarm()

    def _head_too_large(self, data: bytes) -> bool:
        """Counts the request line and headers in ``data`` (up to their blank line), across
        reads; whether they pass ``max_header_bytes``."""
        seen = self._head_tail + data
        end = _HEAD_END.search(seen)
        if end is None:
            self._head_bytes += len(data)
            self._head_tail = seen[-2:]
        else:
            self._head_bytes += end.end() - len(self._head_tail)
        return self._head_bytes > self.limits.max_header_bytes

    def _refuse_head(self) -> None:
        """400, as h11 answers headers too large when they arrive in pieces, then close."""
        message = f"request line and headers exceed {self.limits.max_header_bytes} bytes".encode()
        self.transport.write(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(message), message)
        )
        self.transport.close()

    def on_response_complete(self) -> None:
        self._disarm()
        self.idle_since = self.loop.time()
        if self.conn.their_state is h11.SEND_BODY:
            # Answered before the body was read (a refused key, a body over the limit): close
            # rather than read the rest only to discard it, as uvicorn otherwise would.
            self.transport.close()
            return
        # A pipelined request that came in the same read as an earlier one waits in h11's
        # buffer, never counted by data_received: count it before uvicorn parses it.
        pending, _ = self.conn.trailing_data
        self._head_bytes, self._head_tail = 0, b""
        if pending and self._head_too_large(pending):
            self._refuse_head()
            return
        super().on_response_complete()

    def idle(self) -> bool:
        """No request in progress: between requests, or none begun."""
        cycle = self.cycle
        waiting = self.conn.their_state in (h11.IDLE, h11.DONE)
        return waiting and (cycle is None or cycle.response_complete)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        self._reading_body = False
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        """The request did not arrive in time: close (a handler reading its body sees a
        disconnect)."""
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()
