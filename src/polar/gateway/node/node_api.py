"""The node API a rollout server drives: dispatch, inspect, cancel and drain sessions.

Dispatch is idempotent by session id: a repeat (the server retrying after a lost acknowledgement)
returns the session as it stands and never starts it twice. A session id this node saw in an
earlier life (its capture store knows it) is refused with 409 for the same reason. All routes
need the gateway's admin token or the credential the rollout server issued to this node.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, HTTPException, Request, Response

from polar.auth import same_secret
from polar.errors import AlreadyRan, NodeDraining, NodeFull
from polar.gateway.config import NodeConfig
from polar.gateway.listen import check_advertised
from polar.gateway.model_api_view import model_api_views
from polar.gateway.node.lifecycle import Lifecycle
from polar.gateway.node.node_client import NodeClient
from polar.gateway.node.session_work import NodeContext, RolloutWork, open_session
from polar.gateway.services import GatewayServices, services
from polar.schemas.ids import SessionId
from polar.schemas.node import NodeSessionInfo, NodeStatus, SessionDispatch
from polar.schemas.task import SessionResult, SessionStatus


class NodeSessionDetail(NodeSessionInfo):
    """A session with its result once finished."""

    result: SessionResult | None = None


class GatewayNode:
    """The lifecycle, its rollout-server client, and the wiring between them and the gateway."""

    def __init__(self, gateway: GatewayServices, config: NodeConfig) -> None:
        self.config = config
        self.gateway = gateway
        self.ctx = NodeContext(
            gateway=gateway.config,
            node=config,
            store=gateway.store,
            sessions=gateway.sessions,
            policy_version=lambda: int(gateway.proxy.policy_version),
            engine=gateway.proxy.engine,
        )
        self.lifecycle = Lifecycle(
            config,
            lambda session: RolloutWork(session, self.ctx),
            on_finished=self._on_finished,
            open_session=lambda session: open_session(self.ctx, session),
            known_ids=set(gateway.store.session_ids()),
            node_url=gateway.config.base_url(),
        )
        self.client = (
            NodeClient(config, self.status, self._session_statuses, retire=self._retire)
            if config.rollout_url
            else None
        )

    def accepts(self, token: str | None) -> bool:
        """Whether ``token`` is the credential this node's rollout server calls it with."""
        return self.client is not None and same_secret(token, self.client.credential)

    async def _retire(self, session_ids: list[str]) -> None:
        """The rollout server already finished these sessions without this node (it declared
        the node dead): stop them, and their keys stop working."""
        for session_id in session_ids:
            self.lifecycle.cancel(session_id)
            await self.gateway.sessions.close(session_id)

    async def start(self) -> None:
        url = self.gateway.config.base_url()
        check_advertised(url)  # port 0 or 0.0.0.0 not resolved: refuse rather than get no work
        self.lifecycle.node_url = url
        self.lifecycle.start()
        if self.client is not None:
            self.client.start()

    async def stop(self) -> None:
        await self.lifecycle.stop()
        if self.client is not None:
            await self.client.stop()

    def status(self) -> NodeStatus:
        return self.lifecycle.status(
            paused=self.gateway.gate.paused, policy_version=int(self.gateway.proxy.policy_version)
        )

    def _session_statuses(self) -> dict[str, SessionStatus]:
        return {s.session_id: s.status for s in self.lifecycle.sessions() if not s.finished}

    async def _on_finished(self, result: SessionResult) -> None:
        if self.client is not None:
            await self.client.deliver(result)


def _node(request: Request) -> GatewayNode:
    node = services(request).node
    if node is None:
        raise HTTPException(status_code=404, detail="this gateway runs no session lifecycle")
    return node


# The token is checked before a request reaches these routes (TokenGuard in app.py): the
# gateway's admin token, or the credential the rollout server issued to this node.
router = APIRouter(prefix="/polar/node", tags=["node"])


@router.post(
    "/sessions",
    status_code=201,
    responses={200: {"description": "Already dispatched"}, 409: {}, 429: {}, 503: {}},
)
async def dispatch_session(
    request: Request, response: Response, dispatch: SessionDispatch
) -> NodeSessionInfo:
    """Start a session (201), or return it unchanged if this id was dispatched before (200)."""
    try:
        session, created = await _node(request).lifecycle.dispatch(dispatch)
    except (AlreadyRan, NodeDraining, NodeFull) as exc:
        raise _refusal(exc) from exc
    response.status_code = 201 if created else 200
    return session.info()


def _refusal(exc: AlreadyRan | NodeDraining | NodeFull) -> HTTPException:
    if isinstance(exc, AlreadyRan):
        detail = f"session {exc} already ran on this node; never run twice"
    elif isinstance(exc, NodeDraining):
        detail = "node is draining"
    else:
        detail = "node is at its queue limit"
    return HTTPException(status_code=exc.status, detail=detail)


@router.get("/sessions")
async def list_sessions(request: Request) -> list[NodeSessionInfo]:
    return [s.info() for s in _node(request).lifecycle.sessions()]


@router.get("/sessions/{session_id}", responses={404: {}})
async def get_session(request: Request, session_id: SessionId) -> NodeSessionDetail:
    session = _node(request).lifecycle.get(session_id)
    if session is None:
        raise HTTPException(status_code=404, detail=f"unknown session {session_id!r}")
    return NodeSessionDetail(**session.info().model_dump(), result=session.result)


@router.delete("/sessions/{session_id}", responses={404: {}})
async def cancel_session(request: Request, session_id: SessionId) -> NodeSessionInfo:
    """Cancel at any stage: the runtime is stopped and the session ends as ERROR ("cancelled")."""
    session = _node(request).lifecycle.cancel(session_id)
    if session is None:
        raise HTTPException(status_code=404, detail=f"unknown session {session_id!r}")
    return session.info()


@router.post("/drain")
async def drain(request: Request) -> NodeStatus:
    """Accept no new sessions; finish those already here."""
    node = _node(request)
    node.lifecycle.drain()
    return node.status()


@router.get("/status")
async def status(request: Request) -> NodeStatus:
    return _node(request).status()


def attach_lifecycle(app: FastAPI, gateway: GatewayServices, config: NodeConfig) -> GatewayNode:
    """Add the node API and lifecycle to a gateway app (call before the catch-all proxy route);
    the node goes in ``gateway.node``."""
    node = GatewayNode(gateway, config)
    node.ctx.model_api = model_api_views(app)
    gateway.node = node
    app.include_router(router)
    return node
