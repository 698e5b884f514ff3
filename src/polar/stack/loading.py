"""The embedded engine loading on a thread while the rest of a run starts.

Importing torch and transformers and building SmolLM2 take seconds of one core; starting a
dozen Pi processes takes about a second of CPU each. Done one after the other, the harnesses
wait for the model and then the model waits for the harnesses. A run that loads the model in
the background starts its servers and sessions at once, behind a :class:`LoadingEngine` whose
calls wait for the load, so the harnesses boot while the model loads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, ClassVar

from polar.engines.base import Engine
from polar.engines.types import EngineResult, ModelInfo, SampledTokens
from polar.errors import EngineUnavailable
from polar.providers.types import NormalizedRequest

if TYPE_CHECKING:
    from polar.engines.embedded.client import EmbeddedEngine
    from polar.engines.embedded.core import EmbeddedEngineCore


class ModelLoading(EngineUnavailable):
    """What a loading engine answers when asked, before :meth:`LoadingEngine.expect_calls`,
    what it serves."""


class ModelLoad:
    """``EmbeddedEngineCore.from_source(model)`` running on a daemon thread."""

    def __init__(self, model: str, *, max_active: int, threads: int) -> None:
        self.model = model
        self._future: Future[EmbeddedEngineCore] = Future()
        self._future.set_running_or_notify_cancel()  # nobody waiting on it can cancel it
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(
            target=self._load, args=(max_active, threads), name="polar-model-load", daemon=True
        )
        self._thread.start()

    def _load(self, max_active: int, threads: int) -> None:
        try:
            import torch

            from polar.engines.embedded.core import EmbeddedEngineCore

            torch.set_num_threads(threads)
            core = EmbeddedEngineCore.from_source(self.model, max_active=max_active)
        except BaseException as exc:
            self._future.set_exception(exc)
            return
        with self._lock:
            closed = self._closed
            self._future.set_result(core)
        if closed:
            core.close()

    @property
    def future(self) -> Future[EmbeddedEngineCore]:
        return self._future

    @property
    def done(self) -> bool:
        return self._future.done()

    def failed(self) -> bool:
        return self._future.done() and self._future.exception() is not None

    def result(self, timeout: float | None = None) -> EmbeddedEngineCore:
        """The loaded core (waits for it); raises what the load raised."""
        return self._future.result(timeout)

    def close(self) -> None:
        """Stop the engine, now if it is loaded, else as soon as the load ends."""
        with self._lock:
            self._closed = True
            loaded = self._future.done() and self._future.exception() is None
        if loaded:
            self._future.result().close()

    def stats(self) -> dict[str, Any]:
        """The engine's counters, once it is loaded."""
        if not self.done or self.failed():
            return {}
        return self._future.result().stats()


class LoadingEngine(Engine):
    """The embedded engine while it may still be loading: every call waits for the load.

    A gateway asks what its engine serves when it starts and again at its first call if the
    engine was not up. Until :meth:`expect_calls`, a loading engine answers that it is not up
    yet, so the gateway starts at once; afterwards that question waits for the load too.
    """

    name: ClassVar[str] = "embedded"

    def __init__(self, load: ModelLoad) -> None:
        self.load = load
        self._engine: EmbeddedEngine | None = None
        self._waits = False

    def expect_calls(self) -> None:
        """From now on, asking what the engine serves waits for the load."""
        self._waits = True

    async def loaded(self) -> EmbeddedEngine:
        if self._engine is None:
            try:
                core = await asyncio.shield(asyncio.wrap_future(self.load.future))
            except Exception as exc:
                raise EngineUnavailable(f"the embedded model failed to load: {exc}") from exc
            if self._engine is None:
                from polar.engines.embedded.client import EmbeddedEngine

                self._engine = EmbeddedEngine(core)
        return self._engine

    async def complete(self, request: NormalizedRequest) -> EngineResult:
        return await (await self.loaded()).complete(request)

    async def count_tokens(self, request: NormalizedRequest) -> int:
        return await (await self.loaded()).count_tokens(request)

    async def complete_tokens(
        self, prompt_ids: list[int], request: NormalizedRequest
    ) -> SampledTokens:
        return await (await self.loaded()).complete_tokens(prompt_ids, request)

    async def model_info(self) -> ModelInfo | None:
        if not self._waits and not self.load.done:
            raise ModelLoading(f"the embedded model ({self.load.model}) is still loading")
        return await (await self.loaded()).model_info()

    def local_tokenizer(self) -> Any:
        """Waits for the load: the gateway asks from a worker thread, after model_info."""
        return self.load.result().tokenizer

    async def aclose(self) -> None:
        if self._engine is not None:
            await self._engine.aclose()


@contextlib.contextmanager
def quiet_while_loading(logger: str = "polar.gateway") -> Iterator[None]:
    """Drop the gateway's start-up warning that its engine is not reachable yet when the
    reason is a model still loading here: expected, not worth a line on the terminal."""

    def keep(record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(isinstance(arg, ModelLoading) for arg in args)

    target = logging.getLogger(logger)
    target.addFilter(keep)
    try:
        yield
    finally:
        target.removeFilter(keep)
