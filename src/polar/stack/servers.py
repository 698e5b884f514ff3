"""The two servers as a process that hosts them starts them: configs, sockets, serving.

The layers above the stack (``polar.ray``'s actors, a future launcher) start the gateway and
the rollout server through this module and never import ``polar.gateway`` or
``polar.rollout`` themselves, so how a server is built and served stays the servers' business
and one place here says how a host process reaches them. The apps are imported only when a
server starts: importing this module stays cheap.
"""

from __future__ import annotations

import socket

from polar.gateway.config import GatewayConfig, NodeConfig
from polar.gateway.listen import bind_socket
from polar.gateway.server import BackgroundServer
from polar.rollout.config import RolloutServerConfig
from polar.rollout.node_provider import NodeHost, NodeProvider, node_providers

__all__ = [
    "BackgroundServer",
    "GatewayConfig",
    "NodeConfig",
    "NodeHost",
    "NodeProvider",
    "RolloutServerConfig",
    "bind_socket",
    "node_providers",
    "serve_gateway",
    "serve_rollout",
]


def serve_gateway(config: GatewayConfig) -> tuple[str, BackgroundServer]:
    """Bind the gateway's port first (its node registers its own URL), build the app and
    serve it on a background thread; returns the URL it is reached at and the server."""
    from polar.gateway.app import create_app
    from polar.gateway.listen import bind_gateway

    config, sock = bind_gateway(config)
    server = BackgroundServer(
        create_app(config), host=config.host, sock=sock, limits=config.server_limits()
    )
    return config.base_url(), server.start()


def serve_rollout(
    config: RolloutServerConfig, sock: socket.socket, *, provider: NodeProvider | None = None
) -> BackgroundServer:
    """The rollout server on the already bound ``sock``, with ``provider`` keeping its nodes."""
    from polar.rollout.app import create_rollout_app

    app = create_rollout_app(config, provider=provider)
    return BackgroundServer(app, host=config.host, sock=sock, limits=config.limits).start()
