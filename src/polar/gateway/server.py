"""Running an ASGI app with uvicorn: in the foreground, or in a thread on a free port."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import uvicorn

from polar.serving import ServerLimits, uvicorn_settings

log = logging.getLogger("polar.gateway.server")


class BackgroundServer:
    """uvicorn in a daemon thread; ``port=0`` picks a free loopback port (read ``url``), and
    ``sock`` serves an already bound socket (see :mod:`polar.gateway.listen`).

    ``stop`` ends the thread, the app's shutdown included: requests still in flight after
    ``grace_s`` (a model call that is slow to answer) are cancelled. Without that bound uvicorn
    waits for them before the app's shutdown, ``stop`` gave up first, and the thread lived on
    past its stack: a node's heartbeat kept calling a rollout server already gone."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        loop: str = "auto",
        limits: ServerLimits | None = None,
        sock: socket.socket | None = None,
        grace_s: int = 5,
    ):
        # loop="asyncio": several servers in one process may then start subprocesses (uvloop
        # refuses to from two loops at once).
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            log_config=None,  # uvicorn's lines go through the process's logging (polar.logs)
            access_log=False,
            lifespan="on",
            loop=loop,
            timeout_graceful_shutdown=grace_s,
            **uvicorn_settings(limits or ServerLimits()),
        )
        self.server = uvicorn.Server(config)
        self.host = host
        sockets = [sock] if sock is not None else None
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": sockets}, name="polar-server", daemon=True
        )

    def start(self, timeout_s: float = 30.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server failed to start")
            time.sleep(0.01)
        return self

    @property
    def port(self) -> int:
        sockets = self.server.servers[0].sockets
        return int(sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout_s: float = 30.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("a server thread did not stop within %gs; left behind", timeout_s)

    @property
    def running(self) -> bool:
        """Whether the server's thread is still alive (the tests check none outlives a stop)."""
        return self._thread.is_alive()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
