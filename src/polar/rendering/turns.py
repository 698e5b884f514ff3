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
        # Each key -> the turns it names, oldest first: a model may repeat its call ids
        # (Kimi's functions.NAME:IDX), its answers and its calls.
        self._by_call_id: dict[str, list[str]] = {}
        self._by_content: dict[str, list[str]] = {}
        self._by_signature: dict[str, list[str]] = {}
        self._call_ids: dict[str, list[str]] = {}  # each turn's call ids, as it was entered

    def __len__(self) -> int:
        return len(self._turns)

    def add(
        self, turn: SampledTurn, content: str, tool_call_ids: list[str], has_tool_calls: bool
    ) -> None:
        self._turns[turn.completion_id] = turn
        self._call_ids[turn.completion_id] = list(tool_call_ids)
        for call_id in tool_call_ids:
            self._by_call_id.setdefault(call_id, []).append(turn.completion_id)
        if not has_tool_calls:
            self._by_content.setdefault(content_key(content), []).append(turn.completion_id)
        while len(self._turns) > self.keep:
            self._forget(next(iter(self._turns)))

    def find(self, message: dict[str, Any], context: bytes | None = None) -> SampledTurn | None:
        """The sampled turn an assistant message of a later request stands for, if known: of
        several the message could stand for, the one that answered ``context`` (the digest
        of the request's history before the message), else the latest."""
        for call in message.get("tool_calls") or []:
            call_id = str(call.get("id") or "") if isinstance(call, dict) else ""
            turn = self._pick(self._by_call_id.get(call_id), context)
            if turn is not None:
                return turn
        if message.get("tool_calls"):
            # Calls echoed without the ids the gateway gave them (Gemini callers answering by
            # name): the turn is recognised by its calls' names and arguments, in order.
            signature = calls_signature(message["tool_calls"])
            return self._pick(self._by_signature.get(signature), context)
        return self._pick(self._by_content.get(content_key(message.get("content"))), context)

    def call_ids(self, turn: SampledTurn) -> list[str]:
        """The ids of ``turn``'s calls, in order, as they were entered (the model's own)."""
        return list(self._call_ids.get(turn.completion_id, ()))

    def add_calls(self, completion_id: str, tool_calls: list[dict[str, Any]]) -> None:
        """Let a known turn also be found by its calls' names and arguments."""
        if completion_id in self._turns and tool_calls:
            self._by_signature.setdefault(calls_signature(tool_calls), []).append(completion_id)

    def _pick(self, completion_ids: list[str] | None, context: bytes | None) -> SampledTurn | None:
        turns = [self._turns[c] for c in completion_ids or () if c in self._turns]
        if not turns:
            return None
        turn = next((t for t in reversed(turns) if t.context_digest == context), turns[-1])
        self._turns.move_to_end(turn.completion_id)
        return turn

    def _forget(self, completion_id: str) -> None:
        self._turns.pop(completion_id, None)
        self._call_ids.pop(completion_id, None)
        for index in (self._by_call_id, self._by_content, self._by_signature):
            for key in [k for k, v in index.items() if completion_id in v]:
                index[key] = [c for c in index[key] if c != completion_id]
                if not index[key]:
                    del index[key]
