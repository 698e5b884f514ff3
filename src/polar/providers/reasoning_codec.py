"""Synthetic reasoning signatures that round-trip through the gateway.

Providers hide reasoning behind opaque blobs (Anthropic ``signature``, Responses
``encrypted_content``, Gemini ``thoughtSignature``) that the client must send back unchanged.
Our engines have no secret to sign with, so the blob carries the reasoning text itself; when a
harness replays it, the adapter recovers the exact text and puts it back into history.
"""

from __future__ import annotations

import base64
import binascii

_PREFIX = "polar1:"


def encode_reasoning(text: str) -> str:
    """An opaque, ASCII-safe token that carries ``text``."""
    return _PREFIX + base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii")


def decode_reasoning(blob: str | None) -> str | None:
    """The text inside a blob made by :func:`encode_reasoning`, or ``None`` for foreign blobs."""
    if not blob or not blob.startswith(_PREFIX):
        return None
    try:
        return base64.urlsafe_b64decode(blob[len(_PREFIX) :].encode("ascii")).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None


def encode_reasoning_b64(text: str) -> str:
    """:func:`encode_reasoning` wrapped in standard base64, for the APIs whose signature is
    bytes on the wire (Gemini's ``thoughtSignature`` and thought ``signature``: the Python SDK
    decodes it to bytes and encodes it again)."""
    return base64.b64encode(encode_reasoning(text).encode("ascii")).decode("ascii")


def decode_reasoning_b64(value: object) -> str | None:
    """The reasoning inside one of our signatures, base64-wrapped or bare; None for foreign ones."""
    if not isinstance(value, str) or not value:
        return None
    bare = decode_reasoning(value)
    if bare is not None:
        return bare
    try:
        padded = value.replace("-", "+").replace("_", "/") + "=" * (-len(value) % 4)
        raw = base64.b64decode(padded, validate=True)
        return decode_reasoning(raw.decode("ascii"))
    except (binascii.Error, ValueError):
        return None
