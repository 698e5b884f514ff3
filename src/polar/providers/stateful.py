"""The interface of wire APIs whose replies the server keeps: a later call may continue one, and
a client may fetch it again (OpenAI Responses: ``previous_response_id``, ``GET /responses/{id}``).

Adapters stay pure: they say which stored reply a call continues and how its context joins the
new input; the gateway does the storing and the reading, per session.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from polar.errors import GatewayError
from polar.providers.base import RequestContext
from polar.providers.types import Completion, Message, NormalizedRequest

RETRIEVE = "retrieve"  # GET (or DELETE) of one stored reply


class StatefulReplies(ABC):
    """What a provider adapter with stored replies adds to :class:`~polar.providers.base.Provider`."""

    @abstractmethod
    def reply_id(self, ctx: RequestContext) -> str:
        """The stored reply a ``RETRIEVE`` path names."""

    @abstractmethod
    def reply_to_store(
        self, completion: Completion, request: NormalizedRequest, *, always: bool = False
    ) -> tuple[str, dict[str, Any]] | None:
        """``(id, body)`` of the reply to keep for later calls, or None when the client asked
        for it not to be stored (``always``: kept anyway, for the connection it came over)."""

    @abstractmethod
    def continues(self, request: NormalizedRequest) -> str | None:
        """The id of the stored reply whose context this call continues, if any."""

    @abstractmethod
    def continue_after(
        self, request: NormalizedRequest, context: list[Message], stored: dict[str, Any]
    ) -> None:
        """Put ``context`` (the stored reply's whole prompt and its answer, as the engine saw
        them) before the request's own messages; ``stored`` is the reply body kept for it."""

    @abstractmethod
    def deleted(self, reply_id: str) -> dict[str, Any]:
        """The body answering a DELETE of a stored reply."""

    @abstractmethod
    def not_found(self, reply_id: str, *, continued: bool) -> GatewayError:
        """The provider's error for a reply id this session has not stored (``continued``: it was
        named by a new call rather than fetched)."""
