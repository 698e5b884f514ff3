"""Capture sessions: their one owner (:class:`SessionRegistry`), their typed facts
(:class:`SessionTags`), unguessable keys, and finding a request's session from its URL or key."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from polar.capture.store import CaptureStore
from polar.engines.base import Engine
from polar.errors import AuthenticationFailed, CallBudgetSpent
from polar.providers.registry import routing_table

SESSION_PREFIX = "/s/"
log = logging.getLogger("polar.gateway")


class SessionTags(BaseModel):
    """What a session was opened with: the facts the gateway reads (typed, never by string
    key), and a caller's own keys kept beside them. Stored as the session row's JSON, under
    the same keys as before, so stores written before read the same."""

    model_config = ConfigDict(frozen=True, extra="allow")

    task_id: str | None = None
    sample_index: int | None = None
    node_id: str | None = None
    max_model_calls: int | None = None
    """Refuse model calls past this many (the task's ``agent.max_model_calls``)."""
    harness: str | None = None
    """The harness behind the key, for tagging its side calls (titles, routing, memory)."""
    auto_registered: bool | None = None
    """Opened by the first call with an unknown key (``auto_register``)."""

    def stored(self) -> dict[str, Any]:
        """The row's JSON: the keys given, a fact left out when None (as the bag had it)."""
        unset = {name for name in type(self).model_fields if getattr(self, name) is None}
        return self.model_dump(exclude_unset=True, exclude=unset)

    @classmethod
    def read(cls, stored: Mapping[str, Any]) -> SessionTags:
        """A stored row's tags. A fact whose value does not fit its type (a row no gateway
        wrote) is left out, as the gateway ignored it before, rather than failing a start."""
        try:
            return cls.model_validate(stored)
        except ValidationError as exc:
            bad = {str(error["loc"][0]) for error in exc.errors() if error["loc"]}
            log.warning("session tags %s ignored: they do not fit their types", sorted(bad))
            return cls.model_validate({k: v for k, v in stored.items() if k not in bad})


@dataclass
class GatewaySession:
    """A live session. How many calls it made is the capture store's to say (it survives a
    restart there): ``CaptureStore.call_counts``."""

    session_id: str
    created_at: float = field(default_factory=time.time)
    tags: SessionTags = field(default_factory=SessionTags)
    admitted: int = 0
    """Model calls let through since this gateway process saw the session."""
    budget_spent: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a call past ``max_model_calls`` was refused: the run ends then."""
    _open_calls: int = 0
    _open_since: float = 0.0
    _model_s: float = 0.0

    @property
    def max_model_calls(self) -> int | None:
        return self.tags.max_model_calls

    def admit_call(self) -> None:
        """Count one model call, or refuse it past the task's ``max_model_calls``.

        A harness with no turn limit of its own (Pi, Codex) otherwise loops a weak policy's
        repeated tool call until the session's time budget: the cap ends it after N calls.
        """
        cap = self.max_model_calls
        if cap is not None and self.admitted >= cap:
            self.budget_spent.set()
            raise CallBudgetSpent(
                f"session {self.session_id!r} has made the {cap} model calls its task allows "
                "(agent.max_model_calls)"
            )
        self.admitted += 1

    def call_opened(self) -> None:
        """One of the session's model calls is now with the gateway (see model_seconds)."""
        if self._open_calls == 0:
            self._open_since = time.monotonic()
        self._open_calls += 1

    def call_closed(self) -> None:
        """That call has its answer (or failed)."""
        self._open_calls -= 1
        if self._open_calls == 0:
            self._model_s += time.monotonic() - self._open_since

    def model_seconds(self) -> float:
        """Seconds during which at least one of the session's model calls was with the
        gateway: waiting for the engine (or its model to load), generating, being committed.
        The engine's time, not the harness's (``timeout_counts_model_time``)."""
        if self._open_calls:
            return self._model_s + time.monotonic() - self._open_since
        return self._model_s


def split_session_prefix(path: str) -> tuple[str | None, str]:
    """``/s/<key>/v1/messages`` -> (``key``, ``/v1/messages``); other paths pass through."""
    if not path.startswith(SESSION_PREFIX):
        return None, path
    rest = path[len(SESSION_PREFIX) :]
    key, slash, tail = rest.partition("/")
    return (key or None), slash + tail


def key_from_headers(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The API key wherever the provider's SDK puts it (the providers' ``key_headers``)."""
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        return auth[7:].strip()
    for name in routing_table().key_headers:
        if headers.get(name):
            return headers[name]
    return query.get("key") or None


def base_urls(gateway_url: str, session_id: str) -> dict[str, str]:
    """Where each kind of client should point, as its SDK expects the base URL."""
    return routing_table().base_urls(session_url(gateway_url, session_id))


def session_url(gateway_url: str, session_id: str) -> str:
    """The gateway URL with the session's ``/s/<id>`` prefix."""
    return f"{gateway_url.rstrip('/')}{SESSION_PREFIX}{session_id}"


class SessionClosed(AuthenticationFailed):
    """The session was closed; its id never names a live session again (HTTP 401)."""


class SessionRegistry:
    """The one owner of a gateway's sessions: the live table, the ids of closed ones (never
    live again), and their rows in the capture store. Every open, close and delete goes
    through here; the store is written first where the key starts working, and last where it
    stops (a key never works that a restart would not bring back)."""

    def __init__(self, store: CaptureStore, engine: Engine | None = None) -> None:
        self._store = store
        self._engine = engine
        self._live: dict[str, GatewaySession] = {}
        self._closed: set[str] = set()

    # -- reading ---------------------------------------------------------------------------

    def get(self, session_id: str | None) -> GatewaySession | None:
        return self._live.get(session_id) if session_id else None

    def is_closed(self, session_id: str) -> bool:
        return session_id in self._closed

    def all(self) -> list[GatewaySession]:
        return list(self._live.values())

    def __len__(self) -> int:
        return len(self._live)

    # -- changing --------------------------------------------------------------------------

    async def open(self, session_id: str, tags: SessionTags | None = None) -> GatewaySession:
        """The session's key works from now on, durably (its row is written first). Opening a
        live id again returns it as it is; a closed id raises SessionClosed."""
        live = self._live.get(session_id)
        if live is not None:
            return live
        self._refuse_closed(session_id)
        tags = tags or SessionTags()
        await self._store.add_session(session_id, tags.stored())
        self._refuse_closed(session_id)  # closed while its row was being written
        # Another open of this id may have finished meanwhile: one session object for both.
        return self._live.setdefault(session_id, GatewaySession(session_id, tags=tags))

    async def close(self, session_id: str) -> None:
        """The session's key stops working, now and after a restart; the engine lets go of it
        (a pool's replica assignment). Its records stay. Closing again changes nothing."""
        self._end(session_id)
        await self._store.close_session(session_id)

    async def delete(self, session_id: str) -> None:
        """Close the session and drop its records (its row stays, closed: never reopened)."""
        self._end(session_id)
        await self._store.delete_session(session_id)

    def restore(self, *, close_open: bool = False) -> list[str]:
        """Rebuild the table from the store at start-up: closed sessions stay closed, open ones
        are live again. ``close_open`` (a node: its sessions' runtimes died with its earlier
        life) closes those instead; their ids are returned, for :meth:`close` to write once
        the event loop runs. Their keys answer 401 from the first request on."""
        closed = self._store.closed_sessions()
        unclosed = []
        for session_id, stored in self._store.sessions().items():
            if session_id in closed or close_open:
                self._closed.add(session_id)
                if session_id not in closed:
                    unclosed.append(session_id)
            else:
                self._live[session_id] = GatewaySession(session_id, tags=SessionTags.read(stored))
        return unclosed

    def _end(self, session_id: str) -> None:
        self._closed.add(session_id)
        self._live.pop(session_id, None)
        if self._engine is not None:
            self._engine.end_session(session_id)

    def _refuse_closed(self, session_id: str) -> None:
        if session_id in self._closed:
            raise SessionClosed(f"session {session_id!r} is closed")
