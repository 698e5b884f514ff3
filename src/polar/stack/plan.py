"""What a local run (quickstart, generate) is made of on this machine: runtime, harness and engine.

Each choice degrades gracefully and says so: bubblewrap falls back to a local process when it
is missing or cannot sandbox here, Pi falls back to the bundled Python agent when npm is
missing, and the engine is the embedded one unless a vLLM/SGLang URL is given.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from polar.engines.base import Engine
from polar.engines.embedded.options import DEFAULT_MODEL, TINY_MODEL, served_model_name
from polar.engines.registry import EngineConfig, create_engine
from polar.errors import ConfigError, HarnessError
from polar.harnesses.bundled import AGENT, agent_spec
from polar.harnesses.install import default_prefix, install, installed_names
from polar.harnesses.registry import create_harness, local_presets
from polar.rendering.model_files import smollm2_gguf_path
from polar.runtimes.registry import binds_host_paths
from polar.schemas.task import AgentSpec, RuntimeSpec
from polar.stack.loading import LoadingEngine, ModelLoad

DEFAULT_HARNESS = "pi"
_PROBE_TIMEOUT_S = 20.0
_TRIAL_SANDBOX = [
    *("--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"),
    *("--unshare-pid", "--unshare-net", "--die-with-parent", "true"),
]

Echo = Callable[[str], None]


# -- runtime ---------------------------------------------------------------------------------


def choose_runtime(requested: str | None, warn: Echo) -> str:
    """``requested`` as is; by default bubblewrap when it can sandbox here, else local."""
    if requested:
        return requested
    problem = bubblewrap_problem()
    if problem is None:
        return "bubblewrap"
    warn(
        f"bubblewrap unavailable ({problem}): running harnesses as plain local processes, "
        "without a sandbox. Install it with: apt-get install -y bubblewrap"
    )
    return "local"


def bubblewrap_problem(bwrap: str = "bwrap") -> str | None:
    """Why bubblewrap cannot sandbox here, or None when a trial sandbox works."""
    if shutil.which(bwrap) is None:
        return f"{bwrap} not found"
    argv = [bwrap, *_TRIAL_SANDBOX]
    try:
        probe = subprocess.run(argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"trial sandbox failed: {exc}"
    if probe.returncode != 0:
        return f"trial sandbox failed: {probe.stderr.strip()[-200:] or probe.returncode}"
    return None


def runtime_spec(kind: str, binds: list[str]) -> RuntimeSpec:
    """The sandbox every session gets; read-only binds carry the harness in (bubblewrap)."""
    options: dict[str, Any] = {"ro_binds": binds} if binds_host_paths(kind) and binds else {}
    return RuntimeSpec(kind=kind, network="gateway", options=options)


# -- harness ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HarnessPlan:
    """The harness a run uses: its AgentSpec, what the sandbox must see, and caveats."""

    name: str
    agent: AgentSpec
    binds: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def choose_harness(
    requested: str, *, max_turns: int, model_name: str, stock_prompt: bool, echo: Echo
) -> HarnessPlan:
    """The plan for ``requested`` (any preset that runs unconfigured), installing its CLI if
    needed. A light preset starts from its compact settings unless ``stock_prompt``.

    Pi without npm to install it falls back to the bundled agent, with a warning; any other
    preset without its CLI is an error, since the user asked for that harness by name.
    """
    known = local_presets()
    if requested not in known:
        raise ConfigError(f"unknown quickstart harness {requested!r} (known: {', '.join(known)})")
    preset = create_harness(requested)
    binds: list[str] = []
    if preset.npm_package is not None:
        prefix = default_prefix()
        if requested not in installed_names(prefix):
            if shutil.which("npm") is None:
                if requested != DEFAULT_HARNESS:
                    raise HarnessError(
                        f"{requested} is not installed and npm is not there to install it"
                    )
                plan = agent_plan(max_turns, model_name)
                warning = (
                    "npm not found, so Pi cannot be installed: running the bundled Python agent"
                )
                return HarnessPlan(plan.name, plan.agent, plan.binds, plan.notes, [warning])
            install([requested], prefix, echo=echo)
        binds = [str(prefix)]
    compact = preset.light and not stock_prompt
    agent = preset.agent_spec(max_turns=max_turns, model_name=model_name, compact=compact)
    return HarnessPlan(requested, agent, binds)


def agent_plan(max_turns: int, model_name: str) -> HarnessPlan:
    """The bundled agent preset (its launch carries its own source: nothing to bind)."""
    return HarnessPlan(AGENT, agent_spec(max_turns, model_name))


# -- engine ----------------------------------------------------------------------------------


@dataclass
class EngineHandle:
    """An engine ready for the gateway, with what the run reports about it."""

    engine: Engine
    config: EngineConfig
    label: str
    served_model: str | None
    context_window: int | None
    tokenizer: Any
    policy_version: int = 0
    close: Callable[[], None] = lambda: None
    # The engine's own counters (the embedded engine's prefill and batching), for the summary.
    stats: Callable[[], dict[str, Any]] = dict
    # The embedded model still loading on a thread (``engine`` is then its LoadingEngine).
    loading: ModelLoad | None = None

    def expect_calls(self) -> None:
        """The servers are up: from now on a loading engine's calls wait for the load."""
        if isinstance(self.engine, LoadingEngine):
            self.engine.expect_calls()

    def failed(self) -> bool:
        """Whether a background load failed (:meth:`ready` raises its error)."""
        return self.loading is not None and self.loading.failed()

    def ready(self) -> EngineHandle:
        """Wait for a background load to end (raising what it raised); fill in the tokenizer
        and context window that only the loaded model knows."""
        if self.loading is not None:
            core = self.loading.result()
            self.tokenizer = core.tokenizer
            self.context_window = core.max_model_len
        return self


def open_engine(
    *,
    model: str,
    engine_url: str | None,
    engine_kind: str,
    served_model: str | None,
    tokenizer: str | None,
    threads: int | None = None,
    batch: int = 8,
    background: bool = False,
) -> EngineHandle:
    """The embedded engine serving ``model`` (decoding up to ``batch`` requests at once), or a
    client of the server at ``engine_url``. With ``background``, the embedded model loads on a
    thread and this returns at once (see :mod:`polar.stack.loading`)."""
    if engine_url:
        return _remote_engine(engine_url, engine_kind, served_model, tokenizer)
    if background:
        return _loading_engine(model, threads or engine_threads(), batch)
    import torch

    from polar.engines.embedded.client import EmbeddedEngine
    from polar.engines.embedded.core import EmbeddedEngineCore

    torch.set_num_threads(threads or engine_threads())
    core = EmbeddedEngineCore.from_source(model, max_active=batch)
    return EngineHandle(
        engine=EmbeddedEngine(core),
        config=EngineConfig(kind="embedded", options={"model": model}),
        label="embedded",
        served_model=core.model_name,
        context_window=core.max_model_len,
        tokenizer=core.tokenizer,
        policy_version=core.policy_version,
        close=core.close,
        stats=core.stats,
    )


def _loading_engine(model: str, threads: int, batch: int) -> EngineHandle:
    """The embedded engine, loading on a thread; what is wrong with ``model`` is found now."""
    if model == DEFAULT_MODEL:
        smollm2_gguf_path()  # the package that ships the weights is installed
    elif model != TINY_MODEL and not Path(model).expanduser().exists():
        raise ConfigError(
            f"unknown model {model!r}: expected {DEFAULT_MODEL!r}, {TINY_MODEL!r}, a Hugging "
            "Face checkpoint directory (with config.json) or a .gguf file"
        )
    load = ModelLoad(model, max_active=batch, threads=threads)
    return EngineHandle(
        engine=LoadingEngine(load),
        config=EngineConfig(kind="embedded", options={"model": model}),
        label="embedded",
        served_model=served_model_name(model),
        context_window=None,
        tokenizer=None,
        close=load.close,
        stats=load.stats,
        loading=load,
    )


def engine_threads() -> int:
    """Every core but one for the embedded engine's matrix work.

    The run's harnesses, sandboxes and servers need a core too: with one torch thread per core
    they preempt torch's spinning workers, and a decode step waits on the slowest of them.
    Measured on 2 busy cores, the default run took 52 s with one thread and timed out sessions
    at 191 s with two.
    """
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return max(1, (available or os.cpu_count() or 2) - 1)


def _remote_engine(
    url: str, kind: str, served_model: str | None, tokenizer_path: str | None
) -> EngineHandle:
    url = url.rstrip("/").removesuffix("/v1")
    config = EngineConfig(kind=kind, base_url=url)
    listed = _served_models(url)
    name = served_model or (listed[0]["id"] if listed else None)
    if name is None:
        raise ConfigError(f"{url}/v1/models lists no model: pass --served-model")
    context = next((m.get("max_model_len") for m in listed if m.get("id") == name), None)
    tokenizer = None
    if tokenizer_path:
        from polar.rendering.model_files import load_tokenizer

        tokenizer = load_tokenizer(tokenizer_path)
    return EngineHandle(
        engine=create_engine(config),
        config=config,
        label=f"{kind} at {url}",
        served_model=name,
        context_window=int(context) if context else None,
        tokenizer=tokenizer,
    )


def _served_models(url: str) -> list[dict[str, Any]]:
    try:
        reply = httpx.get(f"{url}/v1/models", timeout=10)
        reply.raise_for_status()
        data = reply.json().get("data") or []
    except (httpx.HTTPError, ValueError) as exc:
        raise ConfigError(f"cannot list the models of the engine at {url}: {exc}") from exc
    return [m for m in data if isinstance(m, dict) and m.get("id")]
