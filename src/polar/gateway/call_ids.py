"""The tool-call ids a harness is given: unique in its session, the model's own in history.

Where call ids come from the model (``Family.model_call_ids``: Kimi K2's ``functions.NAME:IDX``,
which its template renders back as ``## Return of <id>``; or an engine's own parser of that
format), the reply carries whatever the model sampled, and a model that restarts its index
every turn (weak policies early in RL do) samples ``functions.Bash:0`` in turn after turn. The
history the gateway renders must keep those ids, but a harness must never be given one id
twice: Claude Code drops a tool_use whose id it has already seen, so the model never sees that
call's result, asks again, and the session loops until its timeout.

So every id is issued to the harness as the model's own the first time its session is given
it, and as ``<id>_<n>`` (its n-th issue) after that; every id a request brings back is mapped
to the model's own before anything renders it or sends it to the engine. Ids the gateway made
itself (``call_<random>``) never repeat, so for them nothing changes.

The mapping is durable: each capture record lists the ids its reply gave the harness
(``CaptureRecord.harness_call_ids``) and the store keeps them per session
(:meth:`~polar.capture.store.CaptureStore.call_ids`) in the record's own transaction, so a
restarted gateway maps a running session's ids back and never issues one of them again.

Some callers send no ids back at all (Gemini's google-genai users, Pi's Gemini mode: calls and
results by name), and their adapter makes ids up (``NormalizedRequest.made_up_call_ids``). Those
would reach the prompt (``## Return of call_3_0``), so where the last assistant turn is one the
gateway sampled and splices onto (its :class:`~polar.rendering.turns.TurnBook` finds it by the
calls' names and arguments and the history before it), its made-up ids become that turn's own,
and the session remembers each replacement, so the same turn further back in later requests
gets the same ids and their history stays the one the sampled turns answered. With no such
turn (a first call with pasted history, the first call after a restart, engine-side rendering)
the made-up ids stay.
"""

from __future__ import annotations

import asyncio
from typing import Any

from polar.capture.store import CaptureStore
from polar.gateway.sessions import SessionRegistry
from polar.rendering.turns import TurnBook, calls_signature, context_digest


class SessionCallIds:
    """One session's issued ids: the harness's id -> the model's own."""

    def __init__(self, issued: dict[str, str] | None = None) -> None:
        self._model: dict[str, str] = dict(issued or {})
        self._next: dict[str, int] = {}  # where the search for a model id's next alias starts
        # A made-up id -> (the call's name and arguments, the model's id put in its place).
        self._replaced: dict[str, tuple[str, str]] = {}

    def issue(self, model_ids: list[str]) -> list[str]:
        """The ids to give the harness for a reply's calls (``model_ids``, in order)."""
        given = []
        for model_id in model_ids:
            harness_id, n = model_id, self._next.get(model_id, 2)
            while harness_id in self._model:
                harness_id, n = f"{model_id}_{n}", n + 1
            self._next[model_id] = n
            self._model[harness_id] = model_id
            given.append(harness_id)
        return given

    def model_id(self, harness_id: str) -> str:
        """The model's own id behind ``harness_id`` (an id never issued stays as it is)."""
        return self._model.get(harness_id, harness_id)

    def to_model(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` (chat-completions shape) with every call id the model's own; changed
        messages are copies, the harness's own objects are left as they came."""
        return [self._message(message) for message in messages]

    def _message(self, message: dict[str, Any]) -> dict[str, Any]:
        result_id = message.get("tool_call_id")
        if isinstance(result_id, str) and self.model_id(result_id) != result_id:
            message = {**message, "tool_call_id": self.model_id(result_id)}
        calls = message.get("tool_calls")
        if isinstance(calls, list) and any(self._renamed(call) for call in calls):
            message = {
                **message,
                "tool_calls": [
                    {**call, "id": self.model_id(call["id"])} if self._renamed(call) else call
                    for call in calls
                ],
            }
        return message

    def own_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        made_up: set[str],
        book: TurnBook | None,
    ) -> list[dict[str, Any]]:
        """``messages`` with the ``made_up`` call ids the model's own where they are known:
        the ones replaced before, and the last assistant turn's when ``book`` holds the
        sampled turn it stands for, answering the same history (changed messages are copies)."""
        if not made_up:
            return messages
        out = list(messages)
        last = max((i for i, m in enumerate(out) if m.get("role") == "assistant"), default=None)
        replaced: dict[str, str] = {}  # in this request: a made-up id -> the model's
        for at, message in enumerate(out):
            result_id = message.get("tool_call_id") if message.get("role") == "tool" else None
            if isinstance(result_id, str) and result_id in replaced:
                out[at] = {**message, "tool_call_id": replaced[result_id]}
            calls = message.get("tool_calls") if message.get("role") == "assistant" else None
            if not isinstance(calls, list) or not any(_made_up(c, made_up) for c in calls):
                continue
            if at == last and book is not None:
                before = context_digest(out[:at], tools)
                turn = book.find(message, before)
                if turn is not None and turn.context_digest == before:
                    self._learn(calls, made_up, book.call_ids(turn))
            ids = [self._replacement(call, made_up) for call in calls]
            if any(ids):
                replaced.update((c["id"], i) for c, i in zip(calls, ids, strict=True) if i)
                out[at] = {
                    **message,
                    "tool_calls": [
                        {**c, "id": i} if i else c for c, i in zip(calls, ids, strict=True)
                    ],
                }
        return out

    def _learn(self, calls: list[Any], made_up: set[str], model_ids: list[str]) -> None:
        """Remember the model's ids of a sampled turn for the made-up ids of its calls."""
        if len(model_ids) != len(calls):
            return
        for call, model_id in zip(calls, model_ids, strict=True):
            if _made_up(call, made_up):
                self._replaced[call["id"]] = (calls_signature([call]), model_id)

    def _replacement(self, call: Any, made_up: set[str]) -> str | None:
        """The model's id for a made-up one, if this very call (name and arguments) got one."""
        if not _made_up(call, made_up):
            return None
        known = self._replaced.get(call["id"])
        return known[1] if known is not None and known[0] == calls_signature([call]) else None

    def _renamed(self, call: Any) -> bool:
        call_id = call.get("id") if isinstance(call, dict) else None
        return isinstance(call_id, str) and self.model_id(call_id) != call_id


def _made_up(call: Any, made_up: set[str]) -> bool:
    return isinstance(call, dict) and call.get("id") in made_up


class CallIds:
    """Every live session's :class:`SessionCallIds`, read from the store at a session's first
    call in this process (empty for a new session)."""

    def __init__(self, store: CaptureStore, sessions: SessionRegistry) -> None:
        self.store = store
        self.sessions = sessions
        self._by_session: dict[str, SessionCallIds] = {}

    async def of(self, session_id: str) -> SessionCallIds:
        ids = self._by_session.get(session_id)
        if ids is not None:
            return ids
        # A new session is the moment to let go of the ids of finished ones.
        for gone in [s for s in self._by_session if self.sessions.get(s) is None]:
            del self._by_session[gone]
        issued = await asyncio.to_thread(self.store.call_ids, session_id)
        # Another call of the session may have loaded (and issued) meanwhile: that one stands.
        return self._by_session.setdefault(session_id, SessionCallIds(issued))
