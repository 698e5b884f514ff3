"""How both servers (gateway, rollout server) meet the network: limits on connections and on
the time a request may take to arrive, applied in one place to every way a server is started.

uvicorn bounds idle keep-alive time and header size, but a connection that never sends a
request holds its socket forever, and its ``limit_concurrency`` answers 503 to everyone once
idle sockets reach it. :func:`guarded_protocol` closes that gap: a request's line and headers
must arrive within ``header_timeout_s``, its body within ``body_timeout_s``, and beyond
``max_connections`` a new connection displaces the one idle longest (none with a request in
progress), so a flood of silent sockets never stops a legitimate call.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    """Keyword arguments for ``uvicorn.run`` / ``uvicorn.Config`` that apply ``limits``."""
    return {
        "http": guarded_protocol(limits),
        "timeout_keep_alive": limits.keep_alive_s,
        "h11_max_incomplete_event_size": limits.max_header_bytes,
        "backlog": limits.backlog,
    }


def guarded_protocol(limits: ServerLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with ``limits``' read deadlines and connection cap."""

    class GuardedH11Protocol(_GuardedH11Protocol):
        pass

    GuardedH11Protocol.limits = limits
    return GuardedH11Protocol


class _GuardedH11Protocol(H11Protocol):
    limits: ServerLimits

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._reading_body = False
        self.idle_since = self.loop.time()
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
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
        super().data_received(data)
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            if self._deadline is None:  # the first byte of a request after a keep-alive wait
                self._arm(self.limits.header_timeout_s)
        elif state is h11.SEND_BODY:
            if not self._reading_body:
                self._arm(self.limits.body_timeout_s)
                self._reading_body = True
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        self._disarm()
        self.idle_since = self.loop.time()
        if self.conn.their_state is h11.SEND_BODY:
            # Answered before the body was read (a refused key, a body over the limit): close
            # rather than read the rest only to discard it, as uvicorn otherwise would.
            self.transport.close()
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
