"""The services one gateway app holds, as one typed container (``app.state.services``).

:func:`polar.gateway.app.create_app` builds it; routes reach it through :func:`services`, code
holding the app through :func:`app_services`. Nothing else is kept on ``app.state``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.requests import Request

from polar.capture.store import CaptureStore
from polar.engines.base import Engine
from polar.gateway.config import GatewayConfig
from polar.gateway.pause import GenerationGate
from polar.gateway.proxy import Proxy
from polar.gateway.sessions import SessionRegistry

if TYPE_CHECKING:
    from polar.gateway.node.node_api import GatewayNode


@dataclass
class GatewayServices:
    """Everything the gateway's routes share; ``admin_token`` is None only with auth turned
    off; ``node`` is set on a rollout node only."""

    config: GatewayConfig
    engine: Engine
    store: CaptureStore
    sessions: SessionRegistry
    gate: GenerationGate
    proxy: Proxy
    admin_token: str | None = None
    node: GatewayNode | None = None


def app_services(app: Starlette) -> GatewayServices:
    """The services of a gateway app."""
    found = getattr(app.state, "services", None)
    if not isinstance(found, GatewayServices):
        raise TypeError("not a gateway app: app.state.services is missing")
    return found


def services(request: Request) -> GatewayServices:
    """The services of the gateway app serving ``request``."""
    return app_services(request.app)
