"""The canonical capture: what every engine's reply is mapped into, whatever its wire shape."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polar.providers.types import Completion


@dataclass
class TokenCapture:
    """Token-level truth of one call: the engine's prompt ids, sampled ids and their logprobs.

    ``logprobs`` is ``None`` unless it has exactly one entry per sampled id.
    """

    prompt_ids: list[int]
    sampled_ids: list[int]
    logprobs: list[float] | None
    flags: list[str] = field(default_factory=list)
    # MoE routing replay: base64 .npy (positions, layers, top_k), see capture/routed_experts.py.
    routed_experts: str | None = None


@dataclass
class EngineResult:
    """One engine call: the normalized completion, its tokens, and how it was produced."""

    completion: Completion
    tokens: TokenCapture
    engine: str
    upstream_request: dict[str, Any]
    sampling: dict[str, Any]
    policy_version: int | None = None


@dataclass
class SampledTokens:
    """A token-in generation: what the engine sampled after exactly the given prompt ids."""

    sampled_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str
    prompt_ids: list[int] | None  # the engine's own echo of the prompt, when it sends one
    upstream_request: dict[str, Any]
    sampling: dict[str, Any]
    flags: list[str] = field(default_factory=list)
    policy_version: int | None = None
    engine_id: str | None = None
    # Which engine sampled it, when not the gateway's engine itself (a pool's replica).
    engine: str | None = None
    routed_experts: str | None = None


@dataclass(frozen=True)
class PrefixCacheCounters:
    """An engine's own prefix-cache counters since it started, in prompt tokens (vLLM's
    ``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits``)."""

    queries: float
    hits: float

    def __add__(self, other: PrefixCacheCounters) -> PrefixCacheCounters:
        return PrefixCacheCounters(self.queries + other.queries, self.hits + other.hits)

    @property
    def hit_ratio(self) -> float | None:
        return self.hits / self.queries if self.queries else None


@dataclass(frozen=True)
class ModelInfo:
    """What an engine serves: the model name it answers to and its context window."""

    name: str
    max_model_len: int | None = None
    root: str | None = None


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The OpenAI ``usage`` object the vLLM-shaped servers Polar runs (embedded, scripted) send."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
