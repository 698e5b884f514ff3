"""The interface every provider adapter implements, and the few helpers they truly share."""

from __future__ import annotations

import math
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from polar.errors import GatewayError, InvalidRequest, NotFound
from polar.providers.routing import ProviderRouting
from polar.providers.types import Completion, NormalizedRequest

GENERATE = "generate"
COUNT_TOKENS = "count_tokens"
# An SSE comment: the openai and anthropic SDKs' decoders skip lines starting with ':'.
SSE_COMMENT = b": keep-alive\n\n"


@dataclass
class RequestContext:
    """What an adapter may look at besides the body: the path after any ``/s/<key>`` prefix."""

    path: str
    method: str = "POST"
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


class Provider(ABC):
    """Converts one wire API to and from the normalized chat-completions form.

    Adapters are pure: no I/O, no engine knowledge. Every malformed input raises
    :class:`InvalidRequest`; anything else escaping an adapter is a bug.
    """

    name: ClassVar[str]
    routing: ClassVar[ProviderRouting]
    """Where its clients reach the gateway: API roots, key headers, base URL, SDK env names."""

    @abstractmethod
    def operation(self, ctx: RequestContext) -> str | None:
        """``GENERATE`` / ``COUNT_TOKENS`` when this adapter serves ``ctx.path``, else ``None``."""

    def matches_headers(self, headers: Mapping[str, str]) -> bool:
        """Second detection rule, for paths no adapter claims (header names are lower-case)."""
        return False

    def matches_body(self, body: Any) -> bool:
        """Last detection rule: does the JSON body look like this API's request?"""
        return False

    @abstractmethod
    def parse_request(self, body: Any, ctx: RequestContext) -> NormalizedRequest:
        """Normalize a request body (already JSON-decoded) to chat-completions form."""

    @abstractmethod
    def render_response(self, completion: Completion, request: NormalizedRequest) -> dict[str, Any]:
        """The non-streaming reply body."""

    @abstractmethod
    def render_stream(self, completion: Completion, request: NormalizedRequest) -> list[bytes]:
        """A complete synthetic stream (SSE frames) replaying ``completion``."""

    @abstractmethod
    def error_body(self, error: GatewayError) -> dict[str, Any]:
        """The provider's JSON error body for ``error`` (its status is ``error.status``)."""

    @abstractmethod
    def stream_error(self, error: GatewayError) -> bytes:
        """The SSE frames reporting ``error`` once the stream's headers have been sent, shaped
        so the provider's SDK raises its own exception class."""

    def keep_alive(self) -> bytes:
        """A frame that keeps a stream alive while the engine works; SDKs skip it."""
        return SSE_COMMENT

    def render_token_count(self, count: int) -> dict[str, Any]:
        """The reply to a token-counting call, for APIs that have one."""
        raise NotFound(f"{self.name} has no token counting endpoint")


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent-event frame with compact JSON data."""
    payload = data if isinstance(data, bytes) else orjson.dumps(data)
    if event is None:
        return b"data: " + payload + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + payload + b"\n\n"


def new_id(prefix: str) -> str:
    """A random id in the style providers use (``msg_...``, ``call_...``)."""
    return prefix + uuid.uuid4().hex[:24]


def require_dict(body: Any, what: str = "request body") -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest(f"{what} must be a JSON object")
    return body


def require_list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(f"{what} must be an array")
    return value


def optional_number(body: Mapping[str, Any], key: str, kind: type = float) -> Any:
    """A numeric field or ``None``; wrong types are a 400, not a crash."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{key} must be a number")
    if not math.isfinite(value):
        raise InvalidRequest(f"{key} must be a finite number")
    if kind is int:
        if value != int(value):
            raise InvalidRequest(f"{key} must be an integer")
        if not -(2**63) <= value < 2**63:
            raise InvalidRequest(f"{key} is out of range")
        return int(value)
    return float(value)


def stop_list(value: Any) -> list[str] | None:
    """Stop sequences as a list; a single string is accepted as every API allows."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value) or None
    raise InvalidRequest("stop sequences must be a string or an array of strings")


def arguments_object(arguments: str) -> dict[str, Any]:
    """Tool-call arguments as an object; APIs that need a dict get ``{}`` for non-objects."""
    try:
        value = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def arguments_text(arguments: Any) -> str:
    """Tool-call arguments as JSON text, whether the client sent a dict or a string."""
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments or "{}"
    return orjson.dumps(arguments).decode()


def join_text(pieces: list[str]) -> str:
    """Join the text parts of one message; chat templates see one string."""
    return "\n".join(p for p in pieces if p)


def chat_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Chat-completions content from chat parts: one string when all parts are text."""
    if all(p.get("type") == "text" for p in parts):
        return join_text([p.get("text", "") for p in parts])
    return parts
