"""The quickstart's embedded model loading on a thread while its servers and harnesses start."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from polar.engines.embedded.core import EmbeddedEngineCore
from polar.engines.embedded.loader import load_model
from polar.errors import ConfigError, EngineUnavailable
from polar.providers.types import NormalizedRequest, SamplingParams
from polar.stack import plan
from polar.stack.loading import LoadingEngine, ModelLoad, ModelLoading, quiet_while_loading


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Loads of any model block until the event is set, then give the tiny model (or raise
    what ``gate.error`` holds)."""
    release = threading.Event()
    tiny = load_model("tiny")

    def from_source(source: str, **options: Any) -> EmbeddedEngineCore:
        assert release.wait(30)
        error = getattr(release, "error", None)
        if error is not None:
            raise error
        return EmbeddedEngineCore(tiny, **options)

    monkeypatch.setattr(EmbeddedEngineCore, "from_source", staticmethod(from_source))
    threads = torch.get_num_threads()
    yield release
    release.set()
    torch.set_num_threads(threads)


def request() -> NormalizedRequest:
    return NormalizedRequest(
        provider="openai_chat",
        model="polar-tiny-llama",
        messages=[{"role": "user", "content": "Hi"}],
        params=SamplingParams(max_tokens=3, temperature=0.0),
    )


async def test_calls_wait_for_the_load_and_the_start_up_question_does_not(
    gate: threading.Event,
) -> None:
    load = ModelLoad("tiny", max_active=2, threads=1)
    engine = LoadingEngine(load)
    with pytest.raises(ModelLoading, match="still loading"):
        await engine.model_info()  # what a gateway asks at its start: answered at once
    engine.expect_calls()
    info = engine.model_info()  # what it asks at its first call: waits for the model
    gate.set()
    assert (await info).name == "polar-tiny-llama"  # type: ignore[union-attr]
    result = await engine.complete(request())
    assert len(result.tokens.sampled_ids) == 3
    assert engine.local_tokenizer() is load.result().tokenizer
    assert load.stats()["prefill"]["requests"] == 1
    await engine.aclose()
    load.close()


async def test_a_failed_load_fails_calls_as_unavailable_and_the_run_with_its_error(
    gate: threading.Event,
) -> None:
    gate.error = ConfigError("no such model")  # type: ignore[attr-defined]
    handle = plan.open_engine(
        model="tiny", engine_url=None, engine_kind="vllm", served_model=None, tokenizer=None,
        threads=1, background=True,
    )  # fmt: skip
    assert handle.served_model == "polar-tiny-llama" and handle.tokenizer is None
    assert not handle.failed()
    handle.expect_calls()
    gate.set()
    with pytest.raises(EngineUnavailable, match="failed to load: no such model"):
        await handle.engine.complete(request())
    assert handle.failed() and handle.stats() == {}
    with pytest.raises(ConfigError, match="no such model"):
        handle.ready()
    handle.close()


def test_ready_fills_in_what_only_the_loaded_model_knows(gate: threading.Event) -> None:
    handle = plan.open_engine(
        model="tiny", engine_url=None, engine_kind="vllm", served_model=None, tokenizer=None,
        threads=1, background=True,
    )  # fmt: skip
    assert handle.context_window is None
    gate.set()
    handle.ready()
    assert handle.tokenizer is not None and handle.context_window == 8192
    handle.close()
    assert handle.loading is not None and handle.loading.result()._closed


def test_closing_during_the_load_closes_the_engine_when_it_arrives(
    gate: threading.Event,
) -> None:
    load = ModelLoad("tiny", max_active=2, threads=1)
    load.close()
    gate.set()
    core = load.result(timeout=30)
    load._thread.join(timeout=30)
    assert core._closed


def test_unknown_models_fail_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match="unknown model"):
        plan.open_engine(
            model="/nowhere/model.gguf", engine_url=None, engine_kind="vllm",
            served_model=None, tokenizer=None, background=True,
        )  # fmt: skip


def test_only_the_loading_warning_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("polar.gateway")
    with caplog.at_level(logging.WARNING, logger="polar.gateway"), quiet_while_loading():
        log.warning("engine not reachable yet: %s", ModelLoading("still loading"))
        log.warning("engine not reachable yet: %s", EngineUnavailable("connection refused"))
    log.warning("engine not reachable yet: %s", ModelLoading("after the start"))
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [
        "engine not reachable yet: connection refused",
        "engine not reachable yet: after the start",
    ]
