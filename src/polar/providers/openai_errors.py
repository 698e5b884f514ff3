"""OpenAI's error body, shared by the Chat Completions and Responses adapters."""

from __future__ import annotations

from typing import Any

from polar.errors import ContextLengthExceeded, GatewayError

_TYPES = {
    "invalid_request": "invalid_request_error",
    "context_length_exceeded": "invalid_request_error",
    "authentication": "authentication_error",
    "not_found": "not_found_error",
    "request_too_large": "invalid_request_error",
    "rate_limit": "rate_limit_error",
    "engine_error": "server_error",
    "overloaded": "server_error",
    "timeout": "server_error",
}


def openai_error_body(error: GatewayError) -> dict[str, Any]:
    """``{"error": {message, type, param, code}}`` as the OpenAI API returns it."""
    message = error.message
    if isinstance(error, ContextLengthExceeded):
        message = (
            f"This model's maximum context length is {error.limit} tokens. However, your "
            f"messages resulted in {error.prompt_tokens} tokens. Please reduce the length of "
            "the messages."
        )
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(error.kind, "server_error"),
            "param": None,
            "code": error.kind,
        }
    }
