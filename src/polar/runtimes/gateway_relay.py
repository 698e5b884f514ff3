"""The outside half of gateway forwarding, for runtimes that cut the network.

A runtime that leaves only loopback inside (bubblewrap ``--unshare-net``, ``docker --network
none``, ``apptainer --network none``) binds two things into the sandbox: the relay's socket
directory at :data:`RUN_INSIDE` and ``forwarder.py`` at :data:`FORWARDER_INSIDE`. Inside, the
forwarder listens on ``127.0.0.1:port_inside`` and pipes to the socket; outside, this relay pipes
the socket to the gateway. The gateway is then the only address a process inside can reach.

What the socket serves decides what of the gateway a sandbox reaches. A node passes each runtime
its session's model-API view (``model_api``, an ASGI app: the provider routes under that
session's key and nothing else, see ``polar.gateway.model_api_view``), and the relay serves that
app itself, in-process, with uvicorn's HTTP protocol on the socket: admin, node, docs and other
sessions' keys are refused before the gateway sees them. Only a runtime built without a
``model_api`` (a runtime used on its own, as in the runtime tests) gets the raw TCP splice to the
gateway's host:port, which carries its whole HTTP surface.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import uvicorn
from uvicorn.server import ServerState

from polar.errors import ConfigError
from polar.runtimes.base import AsgiApp
from polar.runtimes.forwarder import serve_unix_to_tcp
from polar.serving import ServerLimits, uvicorn_settings

FORWARDER_SOURCE = Path(__file__).with_name("forwarder.py")
FORWARDER_INSIDE = "/.polar/forwarder.py"
RUN_INSIDE = "/.polar/run"
SOCKET_NAME = "gateway.sock"
DEFAULT_PORT_INSIDE = 18080
# sun_path holds 108 bytes; deep session dirs (pytest's tmp_path) overflow it.
_MAX_SOCKET_PATH = 100
_CLOSE_WAIT_S = 2.0
# One harness's share of the node: a sandbox that opens sockets without end, or sends nothing,
# holds at most this much of the gateway process.
SANDBOX_LIMITS = ServerLimits(
    max_connections=64, header_timeout_s=10.0, body_timeout_s=120.0, backlog=64
)


def relay_descriptors(sandboxes: int) -> int:
    """The descriptors the relays of ``sandboxes`` sandboxes may hold at once in the gateway
    process: each its listening socket and up to ``SANDBOX_LIMITS.max_connections`` accepted
    ones (a node's relays serve the model-API view in-process: no second socket per
    connection), which a node's own connection cap must leave free."""
    return sandboxes * (1 + SANDBOX_LIMITS.max_connections)


class GatewayRelay:
    """Listens on a unix socket in the session's run dir: serves ``model_api`` there, or
    without one splices each connection to the gateway's host:port."""

    def __init__(
        self,
        gateway_url: str,
        run_dir: Path,
        port_inside: int = DEFAULT_PORT_INSIDE,
        model_api: AsgiApp | None = None,
    ) -> None:
        url = urlsplit(gateway_url)
        if not url.hostname or url.scheme not in ("http", "https"):
            raise ConfigError(f"gateway_url must be an http(s) URL, got {gateway_url!r}")
        self.scheme = url.scheme
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.path = url.path.rstrip("/")
        self.port_inside = port_inside
        self.model_api = model_api
        self.host_dir = run_dir
        self._own_dir = False
        self._server: asyncio.AbstractServer | None = None
        self._state: ServerState | None = None

    @property
    def url_inside(self) -> str:
        if self.model_api is not None:
            # The view is the gateway app itself, served plain on the socket: no TLS, no path.
            return f"http://127.0.0.1:{self.port_inside}"
        return f"{self.scheme}://127.0.0.1:{self.port_inside}{self.path}"

    @property
    def socket_inside(self) -> str:
        return f"{RUN_INSIDE}/{SOCKET_NAME}"

    def forwarder_argv(self, python: list[str]) -> list[str]:
        """The command that runs the inside half (append ``--`` and a command to wrap one)."""
        return [
            *python,
            FORWARDER_INSIDE,
            "--tcp",
            f"127.0.0.1:{self.port_inside}",
            "--unix",
            self.socket_inside,
        ]

    def wrap(self, argv: list[str], python: list[str]) -> list[str]:
        """``argv`` run with the forwarder listening in its network namespace."""
        return [*self.forwarder_argv(python), "--", *argv]

    async def start(self) -> None:
        if len(str(self.host_dir / SOCKET_NAME)) > _MAX_SOCKET_PATH:
            self.host_dir = Path(tempfile.mkdtemp(prefix="polar-gw-"))
            self._own_dir = True
        self.host_dir.mkdir(parents=True, exist_ok=True)
        # A sandbox may run as another uid (docker --user): it must reach the socket.
        os.chmod(self.host_dir, 0o755)
        socket_path = self.host_dir / SOCKET_NAME
        socket_path.unlink(missing_ok=True)
        if self.model_api is None:
            self._server = await serve_unix_to_tcp(str(socket_path), self.host, self.port)
        else:
            self._server = await self._serve_model_api(str(socket_path), self.model_api)
        # The sandbox's user (65534 in docker and bubblewrap) must be able to connect.
        os.chmod(socket_path, 0o666)

    async def _serve_model_api(self, path: str, app: AsgiApp) -> asyncio.AbstractServer:
        """uvicorn's HTTP protocol on the socket, in this loop, without a uvicorn Server (no
        signal handlers, no lifespan: the gateway app is already running)."""
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            log_level=None,
            access_log=False,
            proxy_headers=False,
            server_header=False,
            ws="none",
            **uvicorn_settings(SANDBOX_LIMITS),
        )
        config.load()
        state = self._state = ServerState()
        server = await asyncio.get_running_loop().create_unix_server(
            lambda: config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=state, app_state={}
            ),
            path=path,
            backlog=SANDBOX_LIMITS.backlog,
        )
        return server

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            if self._state is not None:
                for connection in list(self._state.connections):
                    connection.shutdown()
                self._state = None
            # Newer Pythons wait here for open connections; the sandbox is gone by now, but a
            # stuck peer must not hang teardown.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_CLOSE_WAIT_S):
                    await self._server.wait_closed()
            self._server = None
        (self.host_dir / SOCKET_NAME).unlink(missing_ok=True)
        if self._own_dir:
            shutil.rmtree(self.host_dir, ignore_errors=True)
            self._own_dir = False
