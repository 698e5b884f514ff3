"""The bundled agent preset: a registered harness that carries its own source into the runtime,
and asks the model exactly what the old ``shell`` command line asked."""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from polar.errors import ConfigError
from polar.harnesses.bundled import AGENT, AGENT_PATH, agent_spec
from polar.harnesses.registry import harness_for
from polar.harnesses.runner import run_launch
from polar.runtimes.local import LocalRuntime
from polar.schemas.task import AgentSpec, RuntimeSpec

from .test_runner import context


class _Model(BaseHTTPRequestHandler):
    """A chat-completions endpoint: a shell tool call first, then a final answer."""

    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        _Model.seen.append({"path": self.path, "auth": self.headers["authorization"], **body})
        if len(body["messages"]) == 2:
            call = {"name": "shell", "arguments": json.dumps({"command": "echo hi > hi.txt"})}
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": call},
            ]}  # fmt: skip
        else:
            message = {"role": "assistant", "content": "Done."}
        reply = json.dumps({"choices": [{"message": message}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def model_url() -> Iterator[str]:
    _Model.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Model)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


async def _run(tmp_path: Path, url: str, agent_name: str, settings: dict[str, Any]) -> Path:
    runtime = LocalRuntime(RuntimeSpec(kind="local"), tmp_path / agent_name, url)
    await runtime.start()
    try:
        harness = harness_for(AgentSpec(harness=agent_name, settings=settings))
        launch = harness.prepare(context(runtime, settings))
        outcome = await run_launch(launch, runtime, timeout_s=60, harness=agent_name)
        assert outcome.exit_code == 0, outcome.stderr_tail
        assert outcome.stdout_tail.strip().endswith("Done.")
        return Path(runtime.workdir)
    finally:
        await runtime.stop()


async def test_the_preset_runs_the_agent_as_the_old_shell_command_did(
    tmp_path: Path, model_url: str
) -> None:
    workdir = await _run(tmp_path, model_url, AGENT, {"max_turns": 3})
    assert (workdir / "hi.txt").read_text() == "hi\n"
    assert list(workdir.iterdir()) == [workdir / "hi.txt"]  # its source went to the home
    by_preset, _Model.seen = _Model.seen, []
    command = f"python3 {shlex.quote(str(AGENT_PATH))} --max-turns 3 {{instruction}}"
    await _run(tmp_path, model_url, "shell", {"command": command})
    assert by_preset == _Model.seen
    assert [r["path"] for r in by_preset] == ["/s/ps-k/v1/chat/completions"] * 2
    assert by_preset[0]["auth"] == "Bearer ps-k"
    assert by_preset[0]["model"] == "m"


def test_settings_are_validated_and_follow_ups_follow_the_instruction() -> None:
    with pytest.raises(ConfigError, match="max_turns"):
        harness_for(agent_spec(0, "m"))
    launch = harness_for(agent_spec(2, "m")).prepare(
        context_for({"max_turns": 2, "follow_ups": ["-and then?"], "extra_args": ["-u"]})
    )
    assert launch.argv == [
        "python3", "-u", "/h/.polar/agent.py", "--max-turns", "2", "say hi", "-and then?",
    ]  # fmt: skip
    assert launch.files == {"/h/.polar/agent.py": AGENT_PATH.read_text("utf-8")}
    assert launch.env["OPENAI_BASE_URL"] == "http://gw/s/ps-k/v1"


def context_for(settings: dict[str, Any]) -> Any:
    class _Runtime:
        gateway_url_inside, workdir, home = "http://gw", "/w", "/h"

    return context(_Runtime(), settings)
