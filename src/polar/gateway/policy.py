"""The run's policy applied to every normalized request: model name, sampling, output budget."""

from __future__ import annotations

from polar.gateway.config import GatewayConfig
from polar.providers.types import NormalizedRequest
from polar.schemas.flags import FLAG_MAX_TOKENS_CLAMPED

_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed")


def apply_policy(
    request: NormalizedRequest, config: GatewayConfig, served_model: str | None = None
) -> list[str]:
    """Force the served model and the run's sampling; return flags for what was changed.

    ``served_model`` is the name the engine answers to when the config names none. In
    ``override`` mode every knob the policy covers is the run's, an unset one included (a
    client's ``topK`` never reaches the engine); ``default`` mode only fills gaps.
    """
    flags: list[str] = []
    served = config.served_model or served_model
    if served:
        request.model = served
    policy = config.sampling
    for name in _SAMPLING_FIELDS:
        value = getattr(policy, name)
        if policy.mode == "override" or (
            value is not None and getattr(request.params, name) is None
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
