"""The standalone capture API: create a session, list its completions, fetch records, delete.

These routes are FastAPI (typed, in the OpenAPI schema); the model-API proxy beside them is a
raw Starlette endpoint to keep its per-request overhead small.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import orjson
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from polar.capture.records import CaptureRecord
from polar.capture.store import RecordFault
from polar.errors import CaptureError, CorruptRecord
from polar.gateway.services import services
from polar.gateway.sessions import GatewaySession, SessionTags, base_urls
from polar.schemas.ids import SessionId, new_session_id


class CreateSession(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: SessionId | None = Field(
        None, description="Optional; a random unguessable id otherwise."
    )
    metadata: SessionTags = Field(
        default_factory=SessionTags,
        description="Facts the gateway reads (harness, max_model_calls, ...) and your own keys.",
    )


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


# The admin token is checked before a request reaches these routes (TokenGuard in app.py),
# before its body is read.
router = APIRouter(prefix="/polar", tags=["admin"])


def _info(request: Request, session: GatewaySession, calls: int) -> SessionInfo:
    return SessionInfo(
        session_id=session.session_id,
        api_key=session.session_id,
        base_urls=base_urls(services(request).config.base_url(), session.session_id),
        created_at=session.created_at,
        calls=calls,
        metadata=session.tags.stored(),
    )


def _session(request: Request, session_id: SessionId) -> GatewaySession:
    session = services(request).sessions.get(session_id)
    if session is None:
        raise HTTPException(status_code=404, detail=f"unknown session {session_id!r}")
    return session


def _readable(request: Request, session_id: SessionId) -> None:
    """404 unless the session is live or closed: a closed session's key no longer works, but
    its records are the operator's to read (these routes need the admin token)."""
    if not services(request).sessions.is_closed(session_id):
        _session(request, session_id)


@router.post("/sessions", status_code=201)
async def create_session(request: Request, spec: CreateSession) -> SessionInfo:
    sessions = services(request).sessions
    session_id = spec.session_id or new_session_id()
    if sessions.get(session_id) is not None:
        raise HTTPException(status_code=409, detail=f"session {session_id!r} exists")
    if sessions.is_closed(session_id):
        raise HTTPException(
            status_code=409, detail=f"session {session_id!r} was closed; it is never reopened"
        )
    try:
        session = await sessions.open(session_id, spec.metadata)
    except CaptureError as exc:  # the store cannot write now (full, locked): say so
        raise HTTPException(status_code=exc.status, detail=exc.message) from exc
    return _info(request, session, 0)


@router.get("/sessions")
async def list_sessions(request: Request) -> list[SessionInfo]:
    calls = services(request).store.call_counts()
    return [_info(request, s, calls.get(s.session_id, 0)) for s in services(request).sessions.all()]


@router.get("/sessions/{session_id}")
async def get_session(request: Request, session_id: SessionId) -> SessionInfo:
    session = _session(request, session_id)
    calls = services(request).store.call_counts(session_id).get(session_id, 0)
    return _info(request, session, calls)


@router.get("/sessions/{session_id}/completions")
async def list_completions(request: Request, session_id: SessionId) -> list[dict[str, Any]]:
    _readable(request, session_id)
    return services(request).store.summaries(session_id)


@router.get("/sessions/{session_id}/records", response_model=list[CaptureRecord])
def get_records(
    request: Request,
    session_id: SessionId,
    after_seq: int = Query(-1, ge=-1, description="Only calls after this seq (paging)."),
    limit: int | None = Query(None, ge=1, description="At most this many records."),
) -> StreamingResponse:
    """The session's records in call order, streamed a page of rows at a time. A row that does
    not decode is reported in its place as ``{completion_id, session_id, seq, error}``."""
    _readable(request, session_id)
    items = services(request).store.iter_records(session_id, after_seq=after_seq, limit=limit)
    return StreamingResponse(_json_array(items), media_type="application/json")


def _json_array(items: Iterable[CaptureRecord | RecordFault]) -> Iterator[bytes]:
    yield b"["
    for i, item in enumerate(items):
        yield b"," if i else b""
        if isinstance(item, RecordFault):
            yield orjson.dumps(dataclasses.asdict(item))
        else:
            yield orjson.dumps(item.model_dump())
    yield b"]"


@router.get("/sessions/{session_id}/records/{completion_id}")
def get_record(request: Request, session_id: SessionId, completion_id: str) -> CaptureRecord:
    _readable(request, session_id)
    try:
        record = services(request).store.record(completion_id, session_id=session_id)
    except CorruptRecord as exc:
        raise HTTPException(status_code=500, detail=f"corrupt {exc}") from exc
    if record is None:
        raise HTTPException(status_code=404, detail=f"unknown completion {completion_id!r}")
    return record


@router.delete("/sessions/{session_id}", status_code=204)
async def delete_session(request: Request, session_id: SessionId) -> None:
    _session(request, session_id)
    await services(request).sessions.delete(session_id)


@router.post("/pause")
async def pause(request: Request, spec: PauseRequest) -> dict[str, Any]:
    drained = await services(request).gate.pause(spec.timeout_s)
    return {"paused": True, "drained": drained, "in_flight": services(request).gate.in_flight}


@router.post("/resume")
async def resume(request: Request) -> dict[str, Any]:
    services(request).gate.resume()
    return {"paused": False}


@router.post("/policy")
async def set_policy(request: Request, update: PolicyUpdate) -> dict[str, int]:
    services(request).proxy.policy_version = update.policy_version
    return {"policy_version": update.policy_version}


@router.get("/status")
async def status(request: Request) -> dict[str, Any]:
    state = services(request)
    return {
        "sessions": len(state.sessions),
        "paused": state.gate.paused,
        "in_flight": state.gate.in_flight,
        "policy_version": state.proxy.policy_version,
        "engine": state.engine.name,
    }
