"""What the scripted engine answers: replies queued in order, or chosen by the conversation.

Apart from the backend so that a test or demo writes its script without the tokenizer and
HTTP machinery that serve it.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass
class ScriptedReply:
    """One scripted answer. ``tool_calls`` are ``(name, arguments)`` pairs."""

    content: str = ""
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    reasoning: str | None = None
    finish_reason: str | None = None
    error_status: int | None = None
    error_message: str = "scripted engine error"
    delay_s: float = 0.0


class Script:
    """A queue of replies, thread-safe; ``default`` answers when the queue is empty."""

    def __init__(
        self, replies: list[ScriptedReply] | None = None, default: ScriptedReply | None = None
    ):
        self._queue: deque[ScriptedReply] = deque(replies or [])
        self.default = default or ScriptedReply(content="Done.")
        self._lock = threading.Lock()

    def push(self, *replies: ScriptedReply) -> None:
        with self._lock:
            self._queue.extend(replies)

    def next(self) -> ScriptedReply:
        with self._lock:
            return self._queue.popleft() if self._queue else self.default

    needs_conversation: ClassVar[bool] = False
    """Whether :meth:`choose` reads the conversation (the engine then works it out)."""

    def choose(self, conversation: str, turn: int) -> ScriptedReply:
        """The reply to one request; a plain script ignores what was asked and pops its queue."""
        return self.next()


class ConversationScript(Script):
    """Replies chosen by the conversation itself, so concurrent sessions each follow their own
    script: the first rule whose marker occurs in the conversation's text, at the index of the
    assistant turns taken so far (past its end, ``default``). A conversation no marker matches
    takes the queue, then ``default``."""

    needs_conversation: ClassVar[bool] = True

    def __init__(
        self,
        rules: dict[str, list[ScriptedReply]],
        default: ScriptedReply | None = None,
        replies: list[ScriptedReply] | None = None,
    ) -> None:
        super().__init__(replies, default)
        self.rules = {marker: list(steps) for marker, steps in rules.items()}

    def choose(self, conversation: str, turn: int) -> ScriptedReply:
        for marker, steps in self.rules.items():
            if marker in conversation:
                return steps[turn] if turn < len(steps) else self.default
        return self.next()
