"""Identifiers shared by the rollout server and gateway nodes, and their one grammar.

Session, node and task ids are ``[A-Za-z0-9][A-Za-z0-9_-]{0,127}``: a letter or digit, then up
to 127 letters, digits, ``-`` or ``_``. No dots, slashes, separators or spaces, so an id is safe
as a file name, a URL path segment, a header value and a log word. Every entry point checks it
(the schemas below are the wire models' field types); every place an id becomes a path goes
through :func:`path_segment`.
"""

from __future__ import annotations

import re
import secrets
from typing import Annotated

from pydantic import Field

from polar.errors import PolarError

MAX_ID_LENGTH = 128
ID_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_-]{{0,{MAX_ID_LENGTH - 1}}}$"
_ID = re.compile(ID_PATTERN)

_GRAMMAR = f"1 to {MAX_ID_LENGTH} letters, digits, '-' or '_', starting with a letter or digit"

TaskId = Annotated[
    str, Field(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH, description=f"Task id: {_GRAMMAR}.")
]
SessionId = Annotated[
    str,
    Field(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH, description=f"Session id: {_GRAMMAR}."),
]
NodeId = Annotated[
    str, Field(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH, description=f"Node id: {_GRAMMAR}.")
]


class InvalidId(PolarError, ValueError):
    """A value used as a session, node or task id does not follow the id grammar."""

    def __init__(self, value: object) -> None:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        super().__init__(f"invalid id {shown}: an id is {_GRAMMAR}")
        self.value = value


def is_valid_id(value: object) -> bool:
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def path_segment(value: object) -> str:
    """``value`` as one file-name component, or :class:`InvalidId`: the only way an id becomes
    (part of) a path."""
    if not is_valid_id(value):
        raise InvalidId(value)
    assert isinstance(value, str)
    return value


def new_session_id() -> str:
    """192 random bits, URL- and header-safe: the session id doubles as the harness's API key."""
    return "ps-" + secrets.token_urlsafe(24)
