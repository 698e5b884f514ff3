"""What the capture store's writer thread is asked to do: one small frozen type per operation.

Callers queue a :data:`StoreOp`; before its batch begins the writer turns it into a
:data:`Prepared` operation (everything that can fail without the database done: encoding,
compression), which it then applies inside the batch's transaction. The writer dispatches on
the type, so an operation's fields are named and checked, never read by position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from polar.capture.records import CaptureRecord


@dataclass(frozen=True)
class AppendRecord:
    """Store one captured call (it is given its per-session ``seq``)."""

    record: CaptureRecord


@dataclass(frozen=True)
class OpenSession:
    """Write (or rewrite) a session's row with its metadata."""

    session_id: str
    metadata: dict[str, Any]


@dataclass(frozen=True)
class CloseSession:
    """Mark a session's row closed: its key must not come back when a gateway restarts."""

    session_id: str


@dataclass(frozen=True)
class DeleteSession:
    """Drop a session's calls, replies and call ids; its row stays, closed."""

    session_id: str


@dataclass(frozen=True)
class KeepReply:
    """Keep a reply a client may fetch again or continue (APIs with stored responses)."""

    session_id: str
    reply_id: str
    completion_id: str
    body: dict[str, Any]


@dataclass(frozen=True)
class ForgetReply:
    """Drop a kept reply (answers whether the session had one by that id)."""

    session_id: str
    reply_id: str


StoreOp = AppendRecord | OpenSession | CloseSession | DeleteSession | KeepReply | ForgetReply


@dataclass(frozen=True)
class EncodedRecord:
    """A record's columns, computed before its batch so a bad record fails alone."""

    record: CaptureRecord
    prompt: np.ndarray
    sampled: bytes
    logprobs: bytes | None
    flags: str
    tags: str
    body: bytes
    harness_ids: str | None
    call_ids: list[tuple[str, str, str]]  # (session, the harness's id, the model's) per call


@dataclass(frozen=True)
class SessionRow:
    """An :class:`OpenSession` with its metadata encoded."""

    session_id: str
    metadata: bytes


@dataclass(frozen=True)
class ReplyRow:
    """A :class:`KeepReply` with its body encoded and compressed."""

    session_id: str
    reply_id: str
    completion_id: str
    body: bytes


# The operations that need no preparation go to the batch as they are.
Prepared = EncodedRecord | SessionRow | ReplyRow | CloseSession | DeleteSession | ForgetReply
