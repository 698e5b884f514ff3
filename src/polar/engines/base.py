"""The interface every upstream engine implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from polar.engines.types import EngineResult, ModelInfo, PrefixCacheCounters, SampledTokens
from polar.errors import ConfigError
from polar.providers.types import NormalizedRequest


class Engine(ABC):
    """An inference backend that returns prompt ids, sampled ids and logprobs with each reply."""

    name: ClassVar[str]
    # Where a token prompt takes a regex its output must match (e.g. vLLM's
    # ``structured_outputs.regex``); None: the engine has no constrained decoding.
    regex_constraint: ClassVar[str | None] = None

    @abstractmethod
    async def complete(self, request: NormalizedRequest) -> EngineResult:
        """Run one non-streaming generation and return it with its token capture."""

    @abstractmethod
    async def count_tokens(self, request: NormalizedRequest) -> int:
        """The prompt length the engine would see for ``request``."""

    async def complete_tokens(
        self, prompt_ids: list[int], request: NormalizedRequest
    ) -> SampledTokens:
        """Generate after exactly ``prompt_ids`` (gateway-side rendering, ``render: gateway``);
        ``request`` supplies the model name and sampling parameters."""
        raise ConfigError(f"the {self.name} engine takes no token prompts; use render: engine")

    async def model_info(self) -> ModelInfo | None:
        """The served model and its context window, if the engine says (``/v1/models``)."""
        return None

    async def prefix_cache_counters(self) -> dict[str, PrefixCacheCounters]:
        """The engine's own prefix-cache counters by replica; {} when it exposes none."""
        return {}

    def local_tokenizer(self) -> object | None:
        """The tokenizer of an in-process engine (the gateway renders with the same one)."""
        return None

    def end_session(self, session_id: str) -> None:  # noqa: B027 - optional hook
        """The session is closed: let go of what the engine keeps for it (a pool's replica
        assignment); the default keeps nothing."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most engines hold nothing
        """Release connections; the default holds none."""
