"""The dashboard's routes: pages, their live parts, the login that sets the viewer cookie, and
the two static files. Read-only: nothing here changes the server's state."""

from __future__ import annotations

import asyncio
import time
from functools import cache
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import RedirectResponse, Response
from jinja2 import Environment, PackageLoader, Template

from polar import __version__
from polar.rollout.dashboard.outcomes import Outcomes
from polar.rollout.dashboard.views import node_card, task_card, throughput
from polar.rollout.service import RolloutService
from polar.schemas.ids import SessionId, TaskId
from polar.schemas.rollout import EventKind
from polar.schemas.task import TaskStatus
from polar.trajectory.html import TokenText, environment, session_view

# The most tasks the overview lists (running ones first, then the most recent).
TASKS_SHOWN = 30
# The most sessions a task's page lists.
SESSIONS_SHOWN = 500
_LOGIN_BODY_BYTES = 4096
_STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
# Nothing but this server: no inline script, no other origin. Inline style attributes draw
# the bars' widths.
_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; connect-src 'self'; img-src 'self' data:;"
        " style-src 'self' 'unsafe-inline'; base-uri 'none'; form-action 'self';"
        " frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}

router = APIRouter(prefix="/dashboard", include_in_schema=False)


@router.get("")
async def overview(request: Request) -> Response:
    return _page("overview.html.jinja", await _overview(request), request)


@router.get("/live")
async def overview_live(request: Request) -> Response:
    return _part("overview.html.jinja", await _overview(request), request)


@router.get("/tasks/{task_id}")
async def task_page(request: Request, task_id: TaskId) -> Response:
    return _page("task.html.jinja", await _task(request, task_id), request)


@router.get("/tasks/{task_id}/live")
async def task_live(request: Request, task_id: TaskId) -> Response:
    return _part("task.html.jinja", await _task(request, task_id), request)


@router.get("/sessions/{session_id}")
async def session_page(request: Request, session_id: SessionId) -> Response:
    """A session's trajectory, turn by turn (its status, while it is not finished)."""
    service = _service(request)
    row = await asyncio.to_thread(service.store.session, session_id)
    if row is None:
        raise HTTPException(status_code=404, detail=f"unknown session {session_id!r}")
    decoder = TokenText(request.app.state.tokenizer)
    view = (
        await asyncio.to_thread(session_view, row.result, decoder)
        if row.result is not None
        else None
    )
    return _page(
        "session.html.jinja",
        {"row": row, "session": view, "decoded": decoder.tokenizer is not None},
        request,
    )


@router.get("/static/{name}")
async def static(name: str) -> Response:
    media = _STATIC.get(name)
    if media is None:
        raise HTTPException(status_code=404, detail=f"no {name!r}")
    body = resources.files("polar.rollout.dashboard").joinpath("static", name).read_bytes()
    if name == "dashboard.css":
        body += _templates().get_template("trajectory.css.jinja").render().encode()
    return Response(body, media_type=media, headers=_HEADERS)


@router.get("/login")
async def login_page(request: Request, token: str | None = None) -> Response:
    """With ``?token=`` (the admin or viewer token): set the viewer cookie and go to the
    dashboard; without: a form that asks for it."""
    return _login(request, token)


@router.post("/login")
async def login_form(request: Request) -> Response:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _LOGIN_BODY_BYTES:
            raise HTTPException(status_code=413, detail="a token is not that long")
    token = parse_qs(body.decode("latin-1")).get("token", [None])[0]
    return _login(request, token)


def _login(request: Request, token: str | None) -> Response:
    access = _service(request).access
    home = _base(request) + "/dashboard"
    if access.viewer_token is None or access.viewer_cookie is None:  # auth off
        return RedirectResponse(home, status_code=303)
    if not access.may_view(token):
        page = (
            _templates()
            .get_template("login.html.jinja")
            .render(base=_base(request), wrong=token is not None)
        )
        return Response(page, status_code=401 if token else 200, headers=_HEADERS)
    answer = RedirectResponse(home, status_code=303, headers=_HEADERS)
    answer.set_cookie(
        access.viewer_cookie,
        access.viewer_token,
        httponly=True,
        samesite="strict",
        path=_base(request) or "/",
        secure=request.url.scheme == "https",
    )
    return answer


async def _overview(request: Request) -> dict[str, Any]:
    service = _service(request)
    outcomes = _outcomes(request)
    by_node = service.activity.by_node()
    nodes = [node_card(view, by_node.get(view.node_id)) for view in service.node_views()]
    flow = throughput(service.activity)

    def read() -> dict[str, Any]:
        store, now = service.store, time.time()
        tasks = [
            task_card(t, outcomes.of_task(t.task_id), now) for t in store.latest_tasks(TASKS_SHOWN)
        ]
        return {"tasks": tasks, "task_counts": store.task_counts(), "sessions": store.counts()}

    delivery = service.metrics.delivery
    return {"nodes": nodes, "flow": flow, "delivery": delivery, **await asyncio.to_thread(read)}


async def _task(request: Request, task_id: str) -> dict[str, Any]:
    service = _service(request)
    outcomes = _outcomes(request)

    def read() -> dict[str, Any] | None:
        task = service.store.task(task_id)
        if task is None:
            return None
        sessions = outcomes.of_task(task_id)
        return {
            "task": task_card(task, sessions, time.time()),
            "outcomes": sessions[:SESSIONS_SHOWN],
            "hidden": max(0, len(sessions) - SESSIONS_SHOWN),
            "running": task.status == TaskStatus.RUNNING,
        }

    found = await asyncio.to_thread(read)
    if found is None:
        raise HTTPException(status_code=404, detail=f"unknown task {task_id!r}")
    return found


def _page(name: str, context: dict[str, Any], request: Request) -> Response:
    page = _templates().get_template(name).render(_common(request) | context)
    return Response(page, media_type="text/html", headers=_HEADERS)


def _part(name: str, context: dict[str, Any], request: Request) -> Response:
    """Only the page's ``live`` block: what the script swaps in when something happened."""
    template: Template = _templates().get_template(name)
    block = template.blocks["live"](template.new_context(_common(request) | context))
    return Response("".join(block), media_type="text/html", headers=_HEADERS)


def _common(request: Request) -> dict[str, Any]:
    return {
        "base": _base(request),
        "version": __version__,
        "now": time.time(),
        "event_kinds": " ".join(kind.value for kind in EventKind),
    }


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _outcomes(request: Request) -> Outcomes:
    """The app's headline cache, made on first use."""
    state = request.app.state
    if not hasattr(state, "dashboard_outcomes"):
        state.dashboard_outcomes = Outcomes(_service(request).store)
    outcomes: Outcomes = state.dashboard_outcomes
    return outcomes


def _service(request: Request) -> RolloutService:
    service: RolloutService = request.app.state.service
    return service


@cache
def _templates() -> Environment:
    env = environment(PackageLoader("polar.rollout.dashboard", "templates"))
    env.filters.update(ago=_ago, rate=_rate)
    return env


def _ago(seconds: float | None) -> str:
    """``12 s``, ``4.5 min``, ``2.1 h``."""
    if seconds is None:
        return "–"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _rate(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
