"""Capture sessions: unguessable keys, and finding a request's session from its URL or key."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from polar.errors import AuthenticationFailed, CallBudgetSpent
from polar.providers.registry import routing_table

SESSION_PREFIX = "/s/"


@dataclass
class GatewaySession:
    """A live session. How many calls it made is the capture store's to say (it survives a
    restart there): ``CaptureStore.call_counts``."""

    session_id: str
    created_at: float = field(default_factory=time.time)
    metadata: dict[str, Any] = field(default_factory=dict)
    admitted: int = 0
    """Model calls let through since this gateway process saw the session."""
    budget_spent: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a call past ``max_model_calls`` was refused: the run ends then."""

    @property
    def max_model_calls(self) -> int | None:
        cap = self.metadata.get("max_model_calls")
        return int(cap) if cap is not None else None

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


class SessionTable:
    """In-memory view of live sessions (the capture store keeps them durably), and the ids of
    closed ones, which can never be added again."""

    def __init__(self) -> None:
        self._sessions: dict[str, GatewaySession] = {}
        self._closed: set[str] = set()

    def add(self, session: GatewaySession) -> GatewaySession:
        """Raises SessionClosed for the id of a closed session."""
        if session.session_id in self._closed:
            raise SessionClosed(f"session {session.session_id!r} is closed")
        self._sessions[session.session_id] = session
        return session

    def get(self, session_id: str | None) -> GatewaySession | None:
        return self._sessions.get(session_id) if session_id else None

    def is_closed(self, session_id: str) -> bool:
        return session_id in self._closed

    def remove(self, session_id: str) -> GatewaySession | None:
        """Close a session: its key stops working and its id cannot be added again."""
        self._closed.add(session_id)
        return self._sessions.pop(session_id, None)

    def forget(self, session_id: str) -> GatewaySession | None:
        """Drop a session that never started (its dispatch was refused): not closed."""
        return self._sessions.pop(session_id, None)

    def all(self) -> list[GatewaySession]:
        return list(self._sessions.values())

    def __len__(self) -> int:
        return len(self._sessions)
