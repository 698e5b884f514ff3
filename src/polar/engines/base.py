"""The interface every upstream engine implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from polar.engines.types import EngineResult
from polar.providers.types import NormalizedRequest


class Engine(ABC):
    """An inference backend that returns prompt ids, sampled ids and logprobs with each reply."""

    name: ClassVar[str]

    @abstractmethod
    async def complete(self, request: NormalizedRequest) -> EngineResult:
        """Run one non-streaming generation and return it with its token capture."""

    @abstractmethod
    async def count_tokens(self, request: NormalizedRequest) -> int:
        """The prompt length the engine would see for ``request``."""

    async def health(self) -> bool:
        return True

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most engines hold nothing
        """Release connections; the default holds none."""
