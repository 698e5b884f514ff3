"""The gateway's app factory: all wiring is explicit here, nothing happens at import time."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from polar import __version__
from polar.capture.store import CaptureStore
from polar.engines.base import Engine
from polar.engines.registry import create_engine
from polar.errors import EngineTimeout, EngineUnavailable
from polar.gateway import admin
from polar.gateway.config import GatewayConfig
from polar.gateway.pause import GenerationGate
from polar.gateway.proxy import Proxy, json_response
from polar.gateway.rendering import require_render_extra
from polar.gateway.services import GatewayServices
from polar.gateway.sessions import GatewaySession, SessionTable

_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def create_app(
    config: GatewayConfig,
    *,
    engine: Engine | None = None,
    store: CaptureStore | None = None,
) -> FastAPI:
    """A gateway for ``config``; ``engine`` and ``store`` may be injected (tests, trainers)."""
    require_render_extra(config.render)
    engine = engine or create_engine(config.engine)
    store = store or CaptureStore(config.capture_db, synchronous=config.capture_synchronous)
    sessions = SessionTable()
    for session_id, metadata in store.sessions().items():
        if not metadata.get("closed"):
            sessions.add(GatewaySession(session_id=session_id, metadata=metadata))
    gate = GenerationGate()
    proxy = Proxy(config, engine, store, sessions, gate)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Ask the engine what it serves now: a wrong URL fails the start, in words. An engine
        # that is not up yet is asked again on the first call.
        try:
            await proxy.facts()
        except (EngineUnavailable, EngineTimeout) as exc:
            logging.getLogger("polar.gateway").warning("engine not reachable yet: %s", exc)
        node = gateway.node
        if node is not None:
            await node.start()
        yield
        if node is not None:
            await node.stop()
        await engine.aclose()
        store.close()

    app = FastAPI(title="Polar gateway", version=__version__, lifespan=lifespan)
    gateway = GatewayServices(config, engine, store, sessions, gate, proxy)
    app.state.services = gateway
    app.include_router(admin.router)
    if config.node is not None:
        # Only a rollout node loads the runtime / harness / evaluator stack.
        from polar.gateway.node_api import attach_lifecycle

        attach_lifecycle(app, gateway, config.node)

    @app.get("/health", tags=["admin"])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    async def models(request: Request) -> Response:
        name = config.served_model or "polar"
        return json_response(
            {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "polar"}]}
        )

    app.add_route("/v1/models", models, methods=["GET"], include_in_schema=False)
    app.add_route("/s/{key}/v1/models", models, methods=["GET"], include_in_schema=False)

    async def model_api(request: Request) -> Response:
        return await proxy(request)

    app.add_route("/{path:path}", model_api, methods=_ALL_METHODS, include_in_schema=False)
    return app
