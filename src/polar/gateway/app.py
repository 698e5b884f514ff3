"""The gateway's app factory: all wiring is explicit here, nothing happens at import time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from polar import __version__, tokens
from polar.auth import OPEN, TokenGuard, same_secret
from polar.capture.store import CaptureStore
from polar.engines.base import Engine
from polar.engines.pool import RecallReplica, replica_of
from polar.engines.registry import create_engine
from polar.engines.types import PrefixCacheCounters
from polar.errors import EngineTimeout, EngineUnavailable
from polar.gateway import admin
from polar.gateway.config import GatewayConfig
from polar.gateway.engine_facts import require_render_extra
from polar.gateway.metrics import GatewayMetrics
from polar.gateway.pause import GenerationGate
from polar.gateway.proxy import Proxy, json_response
from polar.gateway.responses_websocket import ResponsesSocket
from polar.gateway.services import GatewayServices
from polar.gateway.sessions import SessionRegistry

log = logging.getLogger("polar.gateway")

_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def create_app(
    config: GatewayConfig,
    *,
    engine: Engine | None = None,
    store: CaptureStore | None = None,
) -> FastAPI:
    """A gateway for ``config``; ``engine`` and ``store`` may be injected (tests, trainers)."""
    require_render_extra(config.render)
    store = store or CaptureStore(config.capture_db, synchronous=config.capture_synchronous)
    engine = engine or create_engine(config.engine, recall=_recall_replica(store))
    admin_token = tokens.admin_token(
        host=config.host,
        auth=config.auth,
        configured=config.admin_token,
        token_file=config.token_file(),
        what="gateway",
        how="the gateway then makes an admin token (or set admin_token / --admin-token).",
    )
    sessions = SessionRegistry(store, engine)
    # A node's sessions of an earlier life cannot resume (their runtimes are gone): they are
    # closed now, and their keys answer 401 from the first request on.
    orphans = sessions.restore(close_open=config.node is not None)
    gate = GenerationGate()
    metrics = GatewayMetrics()
    proxy = Proxy(config, engine, store, sessions, gate, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Ask the engine what it serves now: a wrong URL fails the start, in words. An engine
        # that is not up yet is asked again on the first call.
        try:
            await proxy.facts()
        except (EngineUnavailable, EngineTimeout) as exc:
            log.warning("engine not reachable yet: %s", exc)
        for session_id in orphans:
            await sessions.close(session_id)
        node = gateway.node
        if node is not None:
            await node.start()
        yield
        if node is not None:
            await node.stop()
        await engine.aclose()
        store.close()

    app = FastAPI(title="Polar gateway", version=__version__, lifespan=lifespan)
    gateway = GatewayServices(config, engine, store, sessions, gate, proxy, admin_token)
    app.state.services = gateway
    docs = {app.docs_url, app.redoc_url, app.openapi_url, app.swagger_ui_oauth2_redirect_url}

    def authorize(path: str, token: str | None) -> str | None:
        """/polar/*, /metrics and the docs need the admin token (the node API also takes the
        credential this node's rollout server holds); /health and the model API (keyed by
        session) not."""
        if admin_token is None or not (
            path.startswith("/polar") or path in docs or path == "/metrics"
        ):
            return OPEN
        if same_secret(token, admin_token):
            return "admin"
        node = gateway.node
        if path.startswith("/polar/node/") and node is not None and node.accepts(token):
            return "rollout"
        return None

    app.add_middleware(TokenGuard, authorize=authorize, realm="the gateway's admin token")
    app.include_router(admin.router)
    if config.node is not None:
        # Only a rollout node loads the runtime / harness / evaluator stack.
        from polar.gateway.node.node_api import attach_lifecycle

        attach_lifecycle(app, gateway, config.node)

    @app.get("/health", tags=["admin"])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", tags=["admin"], response_class=PlainTextResponse)
    async def prometheus_metrics() -> Response:
        """Prometheus metrics, in the text exposition format (docs/observability.md)."""
        node = gateway.node
        metrics.engine_prefix_cache(await _prefix_cache(engine))
        return metrics.response(store, sessions, node.status() if node is not None else None)

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
    app.router.add_websocket_route("/{path:path}", ResponsesSocket(proxy).serve)
    return app


def _recall_replica(store: CaptureStore) -> RecallReplica:
    """Where a session's last recorded call ran: a pool keeps sessions there across restarts."""
    return lambda session_id: replica_of(store.last_engine(session_id))


async def _prefix_cache(engine: Engine) -> dict[str, PrefixCacheCounters]:
    """The engine's prefix-cache counters for a scrape; an engine that is slow or down leaves
    them out rather than failing or stalling the scrape."""
    try:
        return await asyncio.wait_for(engine.prefix_cache_counters(), 5.0)
    except Exception as exc:  # the scrape reports the gateway even when its engine is gone
        log.info("engine prefix-cache counters unavailable: %s", exc)
        return {}
