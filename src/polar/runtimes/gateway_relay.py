"""The outside half of gateway forwarding, for runtimes that cut the network.

A runtime that leaves only loopback inside (bubblewrap ``--unshare-net``, ``docker --network
none``, ``apptainer --network none``) binds two things into the sandbox: the relay's socket
directory at :data:`RUN_INSIDE` and ``forwarder.py`` at :data:`FORWARDER_INSIDE`. Inside, the
forwarder listens on ``127.0.0.1:port_inside`` and pipes to the socket; outside, this relay pipes
the socket to the gateway's host:port. The gateway is then the only address a process inside
can reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from polar.errors import ConfigError
from polar.runtimes.forwarder import serve_unix_to_tcp

FORWARDER_SOURCE = Path(__file__).with_name("forwarder.py")
FORWARDER_INSIDE = "/.polar/forwarder.py"
RUN_INSIDE = "/.polar/run"
SOCKET_NAME = "gateway.sock"
DEFAULT_PORT_INSIDE = 18080
# sun_path holds 108 bytes; deep session dirs (pytest's tmp_path) overflow it.
_MAX_SOCKET_PATH = 100
_CLOSE_WAIT_S = 2.0


class GatewayRelay:
    """Listens on a unix socket in the session's run dir and forwards to the gateway."""

    def __init__(
        self, gateway_url: str, run_dir: Path, port_inside: int = DEFAULT_PORT_INSIDE
    ) -> None:
        url = urlsplit(gateway_url)
        if not url.hostname or url.scheme not in ("http", "https"):
            raise ConfigError(f"gateway_url must be an http(s) URL, got {gateway_url!r}")
        self.scheme = url.scheme
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.path = url.path.rstrip("/")
        self.port_inside = port_inside
        self.host_dir = run_dir
        self._own_dir = False
        self._server: asyncio.AbstractServer | None = None

    @property
    def url_inside(self) -> str:
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
        socket_path = self.host_dir / SOCKET_NAME
        socket_path.unlink(missing_ok=True)
        self._server = await serve_unix_to_tcp(str(socket_path), self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
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
