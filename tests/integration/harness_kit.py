"""Running a real agent CLI, installed by Polar's own install step, through the live gateway.

Each run happens in a bubblewrap sandbox whose network namespace holds only loopback: the
gateway is forwarded in through a unix socket, so a CLI that tried to reach any other host
would fail, and the test proves the namespace has nothing else. The scripted engine answers
first with a tool call (a shell command the harness really executes) and then with text.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.capture.records import CaptureRecord
from polar.engines.scripted import ScriptedReply
from polar.gateway.server import BackgroundServer
from polar.gateway.services import app_services
from polar.harnesses.base import HarnessContext
from polar.harnesses.install import default_prefix, install, latest_versions
from polar.harnesses.registry import CLI_PRESETS, create_harness
from polar.harnesses.runner import HarnessOutcome, run_launch
from polar.runtimes.base import Runtime
from polar.runtimes.bubblewrap import BubblewrapRuntime
from polar.schemas.task import RuntimeSpec
from polar.schemas.trajectory import Trajectory
from polar.trajectory.registry import create_builder

MODEL = "polar-model"
TASK = "Create a file named proof.txt that contains the word polar."
COMMAND = "echo polar > proof.txt && echo wrote-proof"
FINAL = "All done."
RUN_TIMEOUT_S = 120.0

# Run inside the sandbox: only `lo` exists, the host's own loopback (where the real gateway
# listens) is unreachable, and the forwarded gateway answers.
_NETWORK_PROBE = """
import socket, sys, urllib.request
host_port, inside_url = int(sys.argv[1]), sys.argv[2]
lines = open("/proc/net/dev").read().splitlines()[2:]
print("interfaces", sorted(line.split(":")[0].strip() for line in lines))
s = socket.socket()
s.settimeout(3)
try:
    s.connect(("127.0.0.1", host_port))
    print("host-loopback reachable")
except OSError:
    print("host-loopback unreachable")
print("gateway", urllib.request.urlopen(inside_url + "/health", timeout=10).status)
"""


# The drift check: POLAR_CLI_VERSIONS=latest runs every real-CLI test (marker cli_drift, given
# to each test that takes harness_prefix) on npm's latest CLIs instead of the pinned ones.
CLI_VERSIONS = os.environ.get("POLAR_CLI_VERSIONS", "pinned")


@pytest.fixture(scope="session")
def harness_prefix() -> Path:
    """All six CLIs, installed once into the user cache (a no-op when already there); at npm's
    latest, in a prefix of their own, under ``POLAR_CLI_VERSIONS=latest``."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install -y bubblewrap)")
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: the harness install step needs it")
    if CLI_VERSIONS == "latest":
        prefix = install(CLI_PRESETS, echo=lambda line: None, latest=True)
        print(f"CLIs at npm's latest: {latest_versions(prefix)}")
        return prefix
    assert CLI_VERSIONS == "pinned", f"POLAR_CLI_VERSIONS is pinned or latest, not {CLI_VERSIONS}"
    return install(CLI_PRESETS, default_prefix(), echo=lambda line: None)


class EngineGateway:
    """A live gateway in front of a real engine, shaped like the harness tests'
    ``live_gateway`` (nothing is scripted: the real model answers); ``tap`` is the recording
    transport between gateway and engine."""

    def __init__(self, server: BackgroundServer, app: Any, tap: Any) -> None:
        self.base_url = server.url
        self.app = app
        self.tap = tap
        self.admin = {"x-polar-admin-token": app_services(app).admin_token or ""}

    def new_session(self) -> Any:
        reply = httpx.post(f"{self.base_url}/polar/sessions", json={}, headers=self.admin)
        reply.raise_for_status()
        return type("Session", (), {"key": reply.json()["api_key"]})

    def script(self, *replies: Any) -> None:
        """The real model answers: nothing is scripted."""

    def records(self, key: str) -> list[CaptureRecord]:
        return app_services(self.app).store.records(key)


@dataclass
class HarnessRun:
    key: str
    outcome: HarnessOutcome
    records: list[CaptureRecord]
    workspace: Path
    network: str


def shell_call(name: str, command: str = COMMAND) -> tuple[str, dict[str, Any]]:
    """The preset's own shell tool called with ``command``: the live run proves the preset
    names the tool its CLI really has."""
    tool = create_harness(name).shell_tool
    assert tool is not None, f"{name} declares no shell tool"
    return tool.call(command)


def sandbox(tmp_path: Path, gateway_url: str, prefix: Path) -> Runtime:
    spec = RuntimeSpec(
        kind="bubblewrap",
        workdir="/workspace",
        network="gateway",
        options={"ro_binds": [str(prefix)]},
    )
    return BubblewrapRuntime(spec, tmp_path / "session", gateway_url)


async def run_two_turns(
    live_gateway: Any,
    tmp_path: Path,
    prefix: Path,
    name: str,
    tool_call: tuple[str, dict[str, Any]],
    settings: dict[str, Any] | None = None,
) -> HarnessRun:
    """Script tool call + final text, run the CLI in a loopback-only sandbox, collect."""
    replies = [ScriptedReply(tool_calls=[tool_call]), ScriptedReply(content=FINAL)]
    return await run_cli(live_gateway, tmp_path, prefix, name, replies, settings)


async def run_cli(
    live_gateway: Any,
    tmp_path: Path,
    prefix: Path,
    name: str,
    replies: list[ScriptedReply],
    settings: dict[str, Any] | None = None,
    timeout_s: float = RUN_TIMEOUT_S,
) -> HarnessRun:
    """Run preset ``name`` for a new session whose engine answers with ``replies``."""
    session = live_gateway.new_session()
    live_gateway.script(*replies)
    runtime = sandbox(tmp_path, live_gateway.base_url, prefix)
    await runtime.start()
    try:
        ctx = HarnessContext(
            session_id=session.key,
            gateway_url=runtime.gateway_url_inside,
            model_name=MODEL,
            instruction=TASK,
            workdir=runtime.workdir,
            home=runtime.home,
            prefix=str(prefix),
            settings=settings or {},
        )
        launch = create_harness(name).prepare(ctx)
        outcome = await run_launch(launch, runtime, timeout_s=timeout_s, harness=name)
        port = int(live_gateway.base_url.rsplit(":", 1)[1])
        probe = await runtime.exec(
            ["python", "-c", _NETWORK_PROBE, str(port), runtime.gateway_url_inside],
            timeout_s=30,
        )
        network = probe.stdout + probe.stderr
    finally:
        await runtime.stop()
    return HarnessRun(
        key=session.key,
        outcome=outcome,
        records=live_gateway.records(session.key),
        workspace=runtime.workspace_path,
        network=network,
    )


def assert_two_turn_run(run: HarnessRun, tokenizer: Any, tool_name: str) -> Trajectory:
    """Everything the issue asks of a real-CLI run; returns the prefix-merged trajectory."""
    assert run.outcome.exit_code == 0
    assert (run.workspace / "proof.txt").read_text() == "polar\n"
    assert "interfaces ['lo']" in run.network, run.network
    assert "host-loopback unreachable" in run.network, run.network
    assert "gateway 200" in run.network, run.network

    assert len(run.records) == 2, [r.response for r in run.records]
    first, second = run.records
    assert [c["function"]["name"] for c in first.response["tool_calls"]] == [tool_name]
    assert second.response["content"] == FINAL
    for record in run.records:
        assert record.prompt_ids and record.sampled_ids
        assert record.logprobs is not None
        assert len(record.logprobs) == len(record.sampled_ids)
        assert not record.tags
    assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids

    trajectory = create_builder("prefix_merging").build(run.records)
    assert len(trajectory.traces) == 1, trajectory.metadata
    trace = trajectory.traces[0]
    n1, n2 = len(first.sampled_ids), len(second.sampled_ids)
    inter = trace.response_ids[n1 : len(trace.response_ids) - n2]
    assert trace.prompt_ids == first.prompt_ids
    assert trace.response_ids == first.sampled_ids + inter + second.sampled_ids
    assert trace.loss_mask == [1] * n1 + [0] * len(inter) + [1] * n2
    assert trace.response_logprobs == first.logprobs + [0.0] * len(inter) + second.logprobs
    # The tool's real output came back to the model, in the masked (untrained) part.
    assert "wrote-proof" in tokenizer.decode(inter)
    return trajectory
