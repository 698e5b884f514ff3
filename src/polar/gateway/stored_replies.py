"""Stored replies, per session: a call may continue one (``previous_response_id``), a client may
fetch or delete one (``GET``/``DELETE /v1/responses/{id}``).

A kept reply points at its call's capture record, and a continuation's context is read from
that record: the messages the engine was sent and the assistant message it answered, exactly
as captured (reasoning and tool calls included). With gateway-side rendering the continued
prompt then extends the earlier call's sampled ids, like any call that replays its history.
A session sees only its own replies: another session's id is as unknown as a made-up one.
A call over a connection that keeps its replies for its own life (a Responses WebSocket, whose
``store: false`` turns still continue by ``previous_response_id``) is kept whatever ``store``
says; that connection forgets those replies when it closes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from polar.capture.store import CaptureStore
from polar.errors import GatewayError, NotFound
from polar.gateway.sessions import GatewaySession
from polar.providers.base import Provider, RequestContext
from polar.providers.stateful import StatefulReplies
from polar.providers.types import Completion, NormalizedRequest


class StoredReplies:
    """The gateway's side of :class:`~polar.providers.stateful.StatefulReplies`."""

    def __init__(self, store: CaptureStore) -> None:
        self.store = store

    async def keep(
        self,
        provider: Provider,
        session: GatewaySession,
        completion: Completion,
        request: NormalizedRequest,
        *,
        for_connection: bool = False,
    ) -> None:
        """Keep ``completion``'s reply when its API stores replies and the client asked to (or
        its connection keeps them all: ``for_connection``)."""
        if not isinstance(provider, StatefulReplies):
            return
        kept = provider.reply_to_store(completion, request, always=for_connection)
        if kept is not None:
            reply_id, body = kept
            await self.store.keep_reply(session.session_id, reply_id, completion.id, body)

    async def resume(
        self, provider: Provider, session: GatewaySession, request: NormalizedRequest
    ) -> None:
        """Put the context of the reply ``request`` continues before its own messages."""
        if not isinstance(provider, StatefulReplies):
            return
        reply_id = provider.continues(request)
        if reply_id is None:
            return
        kept = await asyncio.to_thread(self.store.reply, reply_id, session.session_id)
        if kept is None:
            raise provider.not_found(reply_id, continued=True)
        completion_id, body = kept
        record = await asyncio.to_thread(
            self.store.record, completion_id, session_id=session.session_id
        )
        messages = None if record is None else record.upstream_request.get("messages")
        if record is None or not isinstance(messages, list):
            raise GatewayError(f"the capture record of {reply_id} is missing its messages")
        provider.continue_after(request, [*messages, record.response], body)

    async def answer(
        self, provider: Provider, session: GatewaySession | None, ctx: RequestContext
    ) -> dict[str, Any]:
        """The body answering a GET (the kept reply) or DELETE of one reply of ``session``."""
        if not isinstance(provider, StatefulReplies):
            raise NotFound(f"{provider.name} keeps no replies")
        reply_id = provider.reply_id(ctx)
        if session is not None:
            if ctx.method.upper() == "DELETE":
                if await self.store.forget_reply(session.session_id, reply_id):
                    return provider.deleted(reply_id)
            else:
                kept = await asyncio.to_thread(self.store.reply, reply_id, session.session_id)
                if kept is not None:
                    return kept[1]
        raise provider.not_found(reply_id, continued=False)
