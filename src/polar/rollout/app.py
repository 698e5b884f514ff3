"""The rollout server's HTTP API (``polar serve-rollout``): a thin shell around RolloutService."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import FileResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import Field

from polar import __version__
from polar.auth import OPEN, TokenGuard
from polar.errors import TaskConflict, TaskRefused
from polar.rollout.access import ADMIN, NodeCaller
from polar.rollout.config import RolloutServerConfig
from polar.rollout.dashboard import router as dashboard_router
from polar.rollout.node_provider import NodeProvider
from polar.rollout.service import RolloutService
from polar.schemas.ids import NodeId, TaskId
from polar.schemas.node import NodeReport, Registered
from polar.schemas.rollout import (
    NodeLoss,
    NodeLost,
    NodeView,
    ResultAck,
    ServerStatus,
    SessionView,
    TaskSummary,
)
from polar.schemas.task import SessionResult, SessionStatus, TaskRequest, TaskResult, TaskStatus

MAX_SAMPLES_PER_TASK = 10_000
log = logging.getLogger("polar.rollout")


class TaskSubmission(TaskRequest):
    """A TaskRequest with a ceiling on samples, so one request cannot exhaust the server."""

    num_samples: int = Field(1, ge=1, le=MAX_SAMPLES_PER_TASK)


class FinalResult(SessionResult):
    """A SessionResult whose status is final (what nodes report)."""

    status: Literal[SessionStatus.COMPLETED, SessionStatus.ERROR, SessionStatus.TIMEOUT]


def _service(request: Request) -> RolloutService:
    service: RolloutService = request.app.state.service
    return service


def _caller(request: Request) -> Any:
    """Who TokenGuard admitted: OPEN (auth off), ADMIN, ENROL or a NodeCaller."""
    return request.state.principal


# Every route but /health needs a token, checked before the body is read (TokenGuard, below);
# the node routes then check which node is calling.
router = APIRouter()


@router.post(
    "/tasks",
    status_code=201,
    tags=["tasks"],
    responses={200: {"model": TaskSummary}, 409: {}, 422: {}},
)
async def submit_task(request: Request, response: Response, task: TaskSubmission) -> TaskSummary:
    """Expand ``task`` into ``num_samples`` sessions (201). The same request again, while the
    task runs or after it finished, answers that task (200: a retry is safe); a different
    request under an existing id is 409: a task id is never replaced."""
    try:
        summary, created = await _service(request).submit(TaskRequest(**dict(task)))
    except (TaskConflict, TaskRefused) as exc:
        raise HTTPException(status_code=exc.status, detail=str(exc)) from exc
    if not created:
        response.status_code = 200
    return summary


@router.delete("/tasks/{task_id}", tags=["tasks"], responses={404: {}})
async def cancel_task(request: Request, task_id: TaskId) -> TaskSummary:
    """Cancel the task's unfinished sessions: each ends ERROR, failure ``infra`` /
    ``cancelled`` (those on a node once the node reports them, with what they captured). The
    task and its results stay; cancelling again, or a finished task, changes nothing."""
    summary = await _service(request).cancel(task_id)
    if summary is None:
        raise HTTPException(status_code=404, detail=f"unknown task {task_id!r}")
    return summary


@router.get("/tasks", tags=["tasks"])
async def list_tasks(request: Request) -> list[TaskSummary]:
    return await asyncio.to_thread(_service(request).summaries)


@router.get(
    "/tasks/{task_id}",
    tags=["tasks"],
    response_class=Response,
    responses={200: {"model": TaskResult, "content": {"application/json": {}}}, 404: {}},
)
async def get_task(request: Request, task_id: TaskId) -> Response:
    """The task's status and the results of its finished sessions. To wait for a task, follow
    ``/events`` (or poll ``/tasks/{id}/summary``) and read this once it is COMPLETED."""
    body = await asyncio.to_thread(_service(request).task_result_json, task_id)
    if body is None:
        raise HTTPException(status_code=404, detail=f"unknown task {task_id!r}")
    if isinstance(body, Path):
        return FileResponse(body, media_type="application/json")
    return Response(body, media_type="application/json")


@router.get("/tasks/{task_id}/summary", tags=["tasks"], responses={404: {}})
async def get_task_summary(request: Request, task_id: TaskId) -> TaskSummary:
    """Status and session counts by status: cheap, whatever the size of the results."""
    summary = await asyncio.to_thread(_service(request).summary, task_id)
    if summary is None:
        raise HTTPException(status_code=404, detail=f"unknown task {task_id!r}")
    return summary


@router.get("/tasks/{task_id}/sessions", tags=["tasks"], responses={404: {}})
async def list_sessions(request: Request, task_id: TaskId) -> list[SessionView]:
    service = _service(request)

    def views() -> list[SessionView] | None:
        return service.session_views(task_id) if service.store.task(task_id) else None

    found = await asyncio.to_thread(views)
    if found is None:
        raise HTTPException(status_code=404, detail=f"unknown task {task_id!r}")
    return found


@router.get("/events", tags=["tasks"], response_class=StreamingResponse)
async def events(
    request: Request,
    task_id: TaskId | None = None,
    last_event_id: str | None = Header(None),
) -> StreamingResponse:
    """Server-Sent Events: task_submitted, session_dispatched, session_finished, task_completed,
    callback, node_registered, node_draining, node_dead."""
    after = int(last_event_id) if last_event_id and last_event_id.isdigit() else 0
    stream = _service(request).events.stream(task_id=task_id, last_event_id=after)
    return StreamingResponse(
        stream,
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )


@router.post("/nodes/register", tags=["nodes"], responses={403: {}})
async def register_node(request: Request, report: NodeReport) -> Registered:
    """Enrol a new node id (with the enrolment secret or admin token: the answer carries its
    own credential), or register an id again (after a restart of either side, or after it was
    declared dead) with that credential. A live node's id needs its credential; an id with a
    credential on record needs it or the admin token: the enrolment secret enrols new ids only
    (an operator retires an id with ``DELETE /nodes/{id}``)."""
    service = _service(request)
    caller = _caller(request)
    node_id = report.status.node_id
    if isinstance(caller, NodeCaller):
        if caller.node_id != node_id:
            raise _forbidden(f"this credential is node {caller.node_id!r}'s, not {node_id!r}'s")
        credential = caller.credential
    elif caller != OPEN and service.nodes.live(node_id):
        log.warning("refused to register live node %r again without its credential", node_id)
        raise _forbidden(f"node {node_id!r} is live: registering it again needs its credential")
    elif caller not in (OPEN, ADMIN) and service.access.has_credential(node_id):
        log.warning("refused to register node %r with the enrolment secret: it is known", node_id)
        raise _forbidden(
            f"node {node_id!r} has a credential on record: registering it again needs that "
            f"credential or the admin token (an operator retires the id: DELETE /nodes/{node_id})"
        )
    else:
        credential = await asyncio.to_thread(service.access.issue, node_id)
    return await service.register(report, credential)


@router.delete("/nodes/{node_id}", tags=["nodes"], status_code=204, responses={404: {}, 409: {}})
async def retire_node(request: Request, node_id: NodeId) -> Response:
    """Retire a node id (admin only): its credential is revoked, so the id may enrol anew with
    the enrolment secret. A live node is refused (409): declare it lost or let it die first."""
    service = _service(request)
    if service.nodes.live(node_id):
        raise HTTPException(
            status_code=409,
            detail=f"node {node_id!r} is live: POST /nodes/{node_id}/lost (or drain it) first",
        )
    if not await asyncio.to_thread(service.access.retire, node_id):
        raise HTTPException(status_code=404, detail=f"node {node_id!r} has no credential")
    log.warning("node id %r retired: its credential is revoked", node_id)
    return Response(status_code=204)


@router.post("/nodes/{node_id}/heartbeat", tags=["nodes"], responses={403: {}, 404: {}, 409: {}})
async def heartbeat(request: Request, node_id: NodeId, report: NodeReport) -> Registered:
    """404 tells the node to register again (the server restarted or declared it dead)."""
    _require_node(request, node_id)
    if report.status.node_id != node_id:
        raise HTTPException(status_code=409, detail="node id in path and body differ")
    answer = await _service(request).heartbeat(report)
    if answer is None:
        raise HTTPException(status_code=404, detail=f"node {node_id!r} must register")
    return answer


@router.post("/nodes/{node_id}/drain", tags=["nodes"], responses={403: {}, 404: {}})
async def drain_node(
    request: Request,
    node_id: NodeId,
    deadline_s: Annotated[float | None, Query(gt=0, le=7 * 24 * 3600)] = None,
) -> NodeView:
    """Drain a node: the operator (admin token) or the node itself. With ``deadline_s``, the
    sessions it still has then end ERROR with failure kind infra (``drain_deadline``)."""
    if _caller(request) != ADMIN:
        _require_node(request, node_id)
    service = _service(request)
    if await service.drain(node_id, deadline_s) is None:
        raise HTTPException(status_code=404, detail=f"unknown node {node_id!r}")
    return next(v for v in service.node_views() if v.node_id == node_id)


@router.post("/nodes/{node_id}/lost", tags=["nodes"], responses={401: {}, 404: {}})
async def node_lost(request: Request, node_id: NodeId, loss: NodeLoss | None = None) -> NodeLost:
    """The node is gone (Ray saw it die, an operator knows): its unfinished sessions end ERROR
    now, failure kind infra (``node_lost``), instead of after ``node_grace_s``. Admin only."""
    reason = (loss or NodeLoss()).reason
    failed = await _service(request).node_lost(node_id, reason)
    if failed is None:
        raise HTTPException(status_code=404, detail=f"unknown node {node_id!r}")
    return NodeLost(node_id=node_id, failed_sessions=failed)


def _require_node(request: Request, node_id: str) -> None:
    """Only ``node_id`` itself, with its credential (or anyone, with auth off)."""
    caller = _caller(request)
    if caller == OPEN or (isinstance(caller, NodeCaller) and caller.node_id == node_id):
        return
    raise _forbidden(f"only node {node_id!r} itself, with its credential, may do this")


def _forbidden(detail: str) -> HTTPException:
    return HTTPException(status_code=403, detail=detail)


@router.get("/nodes", tags=["nodes"])
async def list_nodes(request: Request) -> list[NodeView]:
    return _service(request).node_views()


@router.post("/results", tags=["nodes"], responses={403: {}, 404: {}})
async def post_result(request: Request, result: FinalResult) -> ResultAck:
    """A node's final SessionResult; a repeat for the same session is acknowledged, not applied.
    Only the node the session was dispatched to may post it (403 for anyone else, logged)."""
    service = _service(request)
    caller = _caller(request)
    if caller != OPEN:
        row = await asyncio.to_thread(service.store.session, result.session_id)
        if row is None:
            raise HTTPException(status_code=404, detail=f"unknown session {result.session_id!r}")
        sender = caller.node_id if isinstance(caller, NodeCaller) else caller
        if sender != row.node_id or result.task_id != row.task_id:
            log.warning(
                "refused a result for session %s (task %s) from %s: dispatched to %s",
                result.session_id,
                row.task_id,
                sender,
                row.node_id,
            )
            raise _forbidden(f"session {result.session_id!r} was not dispatched to this caller")
        result = result.model_copy(update={"node_id": row.node_id})
    try:
        accepted = await service.accept_result(SessionResult(**dict(result)))
    except KeyError as exc:
        raise HTTPException(status_code=404, detail=f"unknown session {exc}") from exc
    return ResultAck(session_id=result.session_id, accepted=accepted, duplicate=not accepted)


@router.get("/status", tags=["admin"])
async def status(request: Request) -> ServerStatus:
    return await asyncio.to_thread(_service(request).status)


@router.get("/metrics", tags=["admin"], response_class=PlainTextResponse)
async def prometheus_metrics(request: Request) -> Response:
    """Prometheus metrics, in the text exposition format (docs/observability.md)."""
    return await _service(request).metrics_response()


def create_rollout_app(
    config: RolloutServerConfig,
    *,
    service: RolloutService | None = None,
    tokenizer: Any = None,
    provider: NodeProvider | None = None,
) -> FastAPI:
    """The rollout server for ``config``; ``service`` may be injected (tests). With the served
    model's ``tokenizer``, the dashboard shows trajectories' token text, not only their ids.
    ``provider`` starts and watches its gateway nodes (default: static, nodes register)."""
    service = service or RolloutService(config, provider=provider)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        yield
        await service.stop()

    app = FastAPI(title="Polar rollout server", version=__version__, lifespan=lifespan)
    app.state.service = service
    app.state.tokenizer = tokenizer
    app.include_router(router)
    app.include_router(dashboard_router)
    app.add_middleware(
        TokenGuard,
        authorize=service.access.authorize,
        realm="the rollout server's token",
        cookie=service.access.viewer_cookie,
    )

    @app.get("/health", tags=["admin"])
    async def health() -> dict[str, Any]:
        tasks = await asyncio.to_thread(service.store.tasks)
        return {
            "status": "ok",
            "running_tasks": sum(1 for t in tasks if t.status == TaskStatus.RUNNING),
        }

    return app
