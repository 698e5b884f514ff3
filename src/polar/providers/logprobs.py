"""What a client may ask of logprobs: the sampled tokens' own (the gateway captures them for
every call anyway), never top alternatives (not captured: asking for any is a 400 by name)."""

from __future__ import annotations

from typing import Any

from polar.errors import InvalidRequest
from polar.providers.types import CaptureTags


def sampled_logprobs(
    asked: Any, top: int | None, capture: CaptureTags, *, field: str, top_field: str, instead: str
) -> bool:
    """Whether the reply carries the sampled tokens' logprobs; ``asked`` is the request's
    ``field``, ``top`` its ``top_field``; ``instead`` tells the client what to ask for."""
    if asked is not None and not isinstance(asked, bool):
        raise InvalidRequest(f"{field} must be a boolean")
    if top:
        capture.feature("top_logprobs", "refused")
        raise InvalidRequest(
            f"{top_field} is not supported by this gateway (it returns the sampled tokens' "
            f"logprobs only); {instead}"
        )
    if asked:
        capture.feature("logprobs", "honoured")
    return asked is True
