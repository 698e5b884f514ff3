"""Binding a gateway's socket before its app is built, so the URL it advertises is the one it
really listens on.

A node registers ``config.base_url()`` with its rollout server and writes it into every
harness's settings. With ``port: 0`` that would read ``:0``, and with ``host: 0.0.0.0`` it
would name no machine, so the node would register and never receive work. :func:`bind_gateway`
binds first and returns the config with the bound port and, for a wildcard host, a routable
``public_url``.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from polar.errors import ConfigError
from polar.gateway.config import GatewayConfig

WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port`` 0: the kernel picks one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(2048)
    return sock


def routable_host(host: str, toward: str | None = None) -> str:
    """``host`` itself unless it is a wildcard; then the address this machine uses to reach
    ``toward`` (a URL, e.g. the rollout server's), else the one its hostname resolves to."""
    if host not in WILDCARD_HOSTS:
        return host
    target = urlsplit(toward).hostname if toward else None
    if target:
        family = socket.AF_INET6 if ":" in target else socket.AF_INET
        try:
            # A UDP connect sends nothing; it only asks the kernel which source address routes.
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect((target, urlsplit(toward).port or 80))
                return str(probe.getsockname()[0])
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def advertised_url(config: GatewayConfig, port: int) -> str:
    """The URL a gateway bound on ``port`` tells others: ``public_url`` if set, else
    ``http://<routable host>:<port>``."""
    if config.public_url:
        return config.public_url.rstrip("/")
    toward = config.node.rollout_url if config.node else None
    host = routable_host(config.host, toward)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def bind_gateway(config: GatewayConfig) -> tuple[GatewayConfig, socket.socket]:
    """Bind ``config.host:config.port`` and return the config as bound (real port, routable
    ``public_url``) with the listening socket, to hand to the server that serves the app."""
    sock = bind_socket(config.host, config.port)
    port = int(sock.getsockname()[1])
    bound = config.model_copy(update={"port": port})
    if config.host in WILDCARD_HOSTS or config.public_url:
        bound = bound.model_copy(update={"public_url": advertised_url(config, port)})
    return bound, sock


def check_advertised(url: str) -> None:
    """Refuse to advertise a URL no one can reach (a node would register and get no work)."""
    parts = urlsplit(url)
    if parts.port == 0 or (parts.hostname or "") in WILDCARD_HOSTS:
        raise ConfigError(
            f"this node would advertise {url}, which no one can reach: bind first "
            "(polar.gateway.listen.bind_gateway) or set public_url"
        )
