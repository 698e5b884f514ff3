"""The standalone capture API: create a session, list its completions, fetch records, delete.

These routes are FastAPI (typed, in the OpenAPI schema); the model-API proxy beside them is a
raw Starlette endpoint to keep its per-request overhead small.
"""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Depends, Header, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from polar.capture.records import CaptureRecord
from polar.gateway.sessions import GatewaySession, base_urls, new_session_id


class CreateSession(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str | None = Field(None, description="Optional; a random unguessable id otherwise.")
    metadata: dict[str, Any] = Field(default_factory=dict)


class SessionInfo(BaseModel):
    session_id: str
    api_key: str = Field(description="The key harnesses send; it equals the session id.")
    base_urls: dict[str, str]
    created_at: float
    calls: int
    metadata: dict[str, Any]


class PolicyUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy_version: int


class PauseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(60.0, gt=0)


def require_admin(
    request: Request,
    authorization: str | None = Header(None),
    x_polar_admin_token: str | None = Header(None),
) -> None:
    """When an admin token is configured, admin routes need it (Bearer or x-polar-admin-token)."""
    token = request.app.state.config.admin_token
    if not token:
        return
    given = x_polar_admin_token or (authorization or "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise HTTPException(status_code=401, detail="admin token required")


router = APIRouter(prefix="/polar", dependencies=[Depends(require_admin)], tags=["admin"])


def _info(request: Request, session: GatewaySession) -> SessionInfo:
    return SessionInfo(
        session_id=session.session_id,
        api_key=session.session_id,
        base_urls=base_urls(request.app.state.config.base_url(), session.session_id),
        created_at=session.created_at,
        calls=session.calls,
        metadata=session.metadata,
    )


def _session(request: Request, session_id: str) -> GatewaySession:
    session = request.app.state.sessions.get(session_id)
    if session is None:
        raise HTTPException(status_code=404, detail=f"unknown session {session_id!r}")
    return session


@router.post("/sessions", status_code=201)
async def create_session(request: Request, spec: CreateSession) -> SessionInfo:
    sessions = request.app.state.sessions
    session_id = spec.session_id or new_session_id()
    if sessions.get(session_id) is not None:
        raise HTTPException(status_code=409, detail=f"session {session_id!r} exists")
    session = sessions.add(GatewaySession(session_id=session_id, metadata=spec.metadata))
    await request.app.state.store.add_session(session_id, spec.metadata)
    return _info(request, session)


@router.get("/sessions")
async def list_sessions(request: Request) -> list[SessionInfo]:
    return [_info(request, s) for s in request.app.state.sessions.all()]


@router.get("/sessions/{session_id}")
async def get_session(request: Request, session_id: str) -> SessionInfo:
    return _info(request, _session(request, session_id))


@router.get("/sessions/{session_id}/completions")
async def list_completions(request: Request, session_id: str) -> list[dict[str, Any]]:
    _session(request, session_id)
    return request.app.state.store.summaries(session_id)


@router.get("/sessions/{session_id}/records")
async def get_records(request: Request, session_id: str) -> list[CaptureRecord]:
    _session(request, session_id)
    return request.app.state.store.records(session_id)


@router.get("/sessions/{session_id}/records/{completion_id}")
async def get_record(request: Request, session_id: str, completion_id: str) -> CaptureRecord:
    record = request.app.state.store.record(completion_id)
    if record is None or record.session_id != _session(request, session_id).session_id:
        raise HTTPException(status_code=404, detail=f"unknown completion {completion_id!r}")
    return record


@router.delete("/sessions/{session_id}", status_code=204)
async def delete_session(request: Request, session_id: str) -> None:
    _session(request, session_id)
    request.app.state.sessions.remove(session_id)
    await request.app.state.store.delete_session(session_id)


@router.post("/pause")
async def pause(request: Request, spec: PauseRequest) -> dict[str, Any]:
    drained = await request.app.state.gate.pause(spec.timeout_s)
    return {"paused": True, "drained": drained, "in_flight": request.app.state.gate.in_flight}


@router.post("/resume")
async def resume(request: Request) -> dict[str, Any]:
    request.app.state.gate.resume()
    return {"paused": False}


@router.post("/policy")
async def set_policy(request: Request, update: PolicyUpdate) -> dict[str, int]:
    request.app.state.proxy.policy_version = update.policy_version
    return {"policy_version": update.policy_version}


@router.get("/status")
async def status(request: Request) -> dict[str, Any]:
    state = request.app.state
    return {
        "sessions": len(state.sessions),
        "paused": state.gate.paused,
        "in_flight": state.gate.in_flight,
        "policy_version": state.proxy.policy_version,
        "engine": state.engine.name,
    }
