"""The run's policy applied to every normalized request: model name, sampling, output budget."""

from __future__ import annotations

from polar.engines.types import FLAG_MAX_TOKENS_CLAMPED
from polar.gateway.config import GatewayConfig
from polar.providers.types import NormalizedRequest

_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed")


def apply_policy(request: NormalizedRequest, config: GatewayConfig) -> list[str]:
    """Force the served model and the run's sampling; return flags for what was changed."""
    flags: list[str] = []
    if config.served_model:
        request.model = config.served_model
    policy = config.sampling
    for name in _SAMPLING_FIELDS:
        value = getattr(policy, name)
        if value is not None and (
            policy.mode == "override" or getattr(request.params, name) is None
        ):
            setattr(request.params, name, value)
    cap = policy.max_tokens
    if cap is not None:
        if request.params.max_tokens is None:
            request.params.max_tokens = cap
        elif request.params.max_tokens > cap:
            request.params.max_tokens = cap
            flags.append(FLAG_MAX_TOKENS_CLAMPED)
    return flags


def clamp_to_context(request: NormalizedRequest, prompt_tokens: int, context_window: int) -> bool:
    """Shrink the output budget so prompt + output fit the window; True if it changed."""
    room = max(1, context_window - prompt_tokens)
    if request.params.max_tokens is None or request.params.max_tokens > room:
        request.params.max_tokens = room
        return True
    return False
