"""A session's sampled turns, so a later prompt can carry them as sampled instead of re-rendered.

Every completion the gateway renders is entered here with the prompt ids it was given, the ids
the engine sampled, a digest of the conversation it answered, and the identity the harness will
echo back (the tool-call ids the gateway issued, and the reply's text). When a later request's
history ends in that assistant turn and everything before it is unchanged, the new prompt is
that call's prompt + its sampled ids + the rendering of what came after: an exact extension.
"""

from __future__ import annotations

import contextlib
import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

# Sampled turns kept per session; older ones are only needed by retries of old calls.
DEFAULT_TURNS_KEPT = 16


@dataclass(frozen=True)
class SampledTurn:
    """One rendered call: what the engine was given and what it sampled.

    A prompt that extends an earlier turn is stored as that turn (``base``) plus the ids after
    its sampled ones (``own_ids``), so a session's turns cost its unique tokens, not the sum
    of its prompts.
    """

    completion_id: str
    own_ids: array[int]
    sampled_ids: array[int]
    context_digest: bytes
    turn_end: str | None  # the turn-end token it sampled; None: cut by length or a stop string
    base: SampledTurn | None = None

    @property
    def prompt_ids(self) -> list[int]:
        parts: list[array[int]] = [self.own_ids]
        turn = self.base
        while turn is not None:
            parts += [turn.sampled_ids, turn.own_ids]
            turn = turn.base
        return [t for part in reversed(parts) for t in part]


def context_digest(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bytes:
    """A digest of a conversation and its tools, independent of JSON key order."""
    body = orjson.dumps({"messages": messages, "tools": tools}, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(body, digest_size=16).digest()


def content_key(content: Any) -> str:
    """An assistant message's text as a lookup key (harnesses may trim surrounding space)."""
    if isinstance(content, list):
        content = "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return str(content or "").strip()


def calls_signature(tool_calls: list[Any]) -> str:
    """Chat-completions tool calls by name and arguments (JSON key order aside), in order."""
    signature = []
    for call in tool_calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            return ""
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(orjson.JSONDecodeError):
                arguments = orjson.loads(arguments or "{}")
        signature.append([function.get("name"), arguments])
    return orjson.dumps(signature, option=orjson.OPT_SORT_KEYS).decode()


class TurnBook:
    """The recent sampled turns of one session, found by the ids and text the harness echoes."""

    def __init__(self, keep: int = DEFAULT_TURNS_KEPT, started: datetime | None = None) -> None:
        self.keep = keep
        # The session's start: a template that prints today's date prints this one all session
        # long, so a session crossing midnight keeps one prompt prefix.
        self.started = started or datetime.now()
        self._turns: OrderedDict[str, SampledTurn] = OrderedDict()
        self._by_call_id: dict[str, str] = {}
        self._by_content: dict[str, str] = {}
        self._by_signature: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._turns)

    def add(
        self, turn: SampledTurn, content: str, tool_call_ids: list[str], has_tool_calls: bool
    ) -> None:
        self._turns[turn.completion_id] = turn
        for call_id in tool_call_ids:
            self._by_call_id[call_id] = turn.completion_id
        if not has_tool_calls:
            self._by_content[content_key(content)] = turn.completion_id
        while len(self._turns) > self.keep:
            self._forget(next(iter(self._turns)))

    def find(self, message: dict[str, Any]) -> SampledTurn | None:
        """The sampled turn an assistant message of a later request stands for, if known."""
        for call in message.get("tool_calls") or []:
            cid = (
                self._by_call_id.get(str(call.get("id") or "")) if isinstance(call, dict) else None
            )
            if cid is not None and cid in self._turns:
                self._turns.move_to_end(cid)
                return self._turns[cid]
        if message.get("tool_calls"):
            # Calls echoed without the ids the gateway gave them (Gemini callers answering by
            # name): the turn is recognised by its calls' names and arguments, in order.
            cid = self._by_signature.get(calls_signature(message["tool_calls"]))
            if cid is None or cid not in self._turns:
                return None
            self._turns.move_to_end(cid)
            return self._turns[cid]
        cid = self._by_content.get(content_key(message.get("content")))
        if cid is not None and cid in self._turns:
            self._turns.move_to_end(cid)
            return self._turns[cid]
        return None

    def add_calls(self, completion_id: str, tool_calls: list[dict[str, Any]]) -> None:
        """Let a known turn also be found by its calls' names and arguments."""
        if completion_id in self._turns and tool_calls:
            self._by_signature[calls_signature(tool_calls)] = completion_id

    def _forget(self, completion_id: str) -> None:
        self._turns.pop(completion_id, None)
        self._by_call_id = {k: v for k, v in self._by_call_id.items() if v != completion_id}
        self._by_content = {k: v for k, v in self._by_content.items() if v != completion_id}
        self._by_signature = {k: v for k, v in self._by_signature.items() if v != completion_id}
