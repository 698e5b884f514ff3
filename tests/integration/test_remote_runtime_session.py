"""A runtime whose sandbox lives elsewhere runs a whole session on a real node, with no host path.

The toy stands for a pod or a sandbox service: registered by one registry line, it keeps the
workspace "over there" (a dict), runs the commands it is sent itself (a small shell of its
own), and raises if anything asks it for a host path. A task on it goes the node's real way:
rollout server, dispatch, INIT -> READY -> RUNNING -> POSTRUN, the ``shell`` harness launched
through the runtime's exec, model calls through the session's model-API view into the gateway
and the scripted engine, the prefix-merging builder, and ``test_on_output`` grading a fresh
toy runtime onto which the agent's changes were replayed from ``workspace_snapshot()`` through
``workspace_writer()``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, NoReturn

import httpx
import pytest

from integration.rollout_support.cluster import Cluster, shell_task, start_cluster
from polar.errors import ConfigError
from polar.runtimes.base import Capabilities, ExecResult, Launch, Runtime
from polar.runtimes.registry import RUNTIMES, create_runtime
from polar.runtimes.snapshot import MemorySnapshot, WorkspaceSnapshot
from polar.runtimes.workspace_writer import WorkspaceWriter
from polar.schemas.ids import path_segment
from polar.schemas.task import RuntimeSpec, SessionResult, SessionStatus

pytestmark = pytest.mark.slow

STARTING_TREE = {"notes.txt": "scratch\n", "tests/check.txt": "honest\n"}
# The agent's whole run, in the toy's own shell: the model loop, then two edits of its own.
HARNESS = "agent && rm notes.txt && echo cheat > tests/check.txt"
GRADE = "test -f hello.txt && test ! -f notes.txt"


class ToyWriter(WorkspaceWriter):
    """What the toy's service would do with each change it is sent."""

    def __init__(self, remote: dict[str, bytes]) -> None:
        self.remote = remote

    def remove(self, rel: str) -> None:
        for path in [p for p in self.remote if p == rel or p.startswith(rel + "/")]:
            del self.remote[path]

    def write(self, rel: str, source: WorkspaceSnapshot) -> None:
        self.remote[rel] = source.read(rel)

    def link(self, rel: str, target: str) -> None:
        raise OSError("the toy service keeps no links")

    def remove_empty_dir(self, rel: str) -> bool:
        return not any(p.startswith(rel + "/") for p in self.remote)


class ToyRemoteRuntime(Runtime):
    """The workspace is a dict held "over there"; commands are run by the toy itself."""

    name = "toy_remote"
    host_files = False
    built: ClassVar[list[ToyRemoteRuntime]] = []
    """Every toy the node built, to look inside afterwards."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.built.append(self)
        self.remote: dict[str, bytes] = {}
        self.made: list[str] = []
        self.calls = 0

    @property
    def workspace_path(self) -> NoReturn:
        raise AssertionError("a remote runtime has no host path; read workspace_snapshot()")

    @property
    def home_path(self) -> NoReturn:
        raise AssertionError("a remote runtime has no host home")

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            filesystem_isolation=True, network_isolation=True, process_isolation=True
        )

    async def start(self) -> None:
        if not self._started:
            self._started = True
            self.remote = {rel: text.encode() for rel, text in self.spec.files.items()}

    async def stop(self) -> None:
        self._stopped = True

    async def make_dirs(self, *paths: str) -> None:
        self.made.extend(paths)

    async def workspace_snapshot(self) -> WorkspaceSnapshot:
        return MemorySnapshot(dict(self.remote))  # what the service's listing returns

    def workspace_writer(self) -> WorkspaceWriter:
        return ToyWriter(self.remote)

    def _launch(self, argv: list[str], env: dict[str, str], cwd: str, exec_id: str) -> Launch:
        raise AssertionError("nothing is launched on the host")

    async def exec(
        self, command: str | list[str], *, env: dict[str, str] | None = None, **_: Any
    ) -> ExecResult:
        assert self.running
        if isinstance(command, list):  # bash -c SCRIPT [ARGS]: the harness or its probe
            assert command[:2] == ["bash", "-c"], command
            if command[2].startswith("command -v"):  # the runner asks whether bash is there
                return _result(0 if command[4] == "bash" else 1, command[4])
            command = command[2]
        for part in command.split("&&"):
            result = await self._run(shlex.split(part), env or {})
            if result.exit_code != 0:
                return result
        return result

    async def _run(self, argv: list[str], env: dict[str, str]) -> ExecResult:
        match argv:
            case ["agent"]:
                return _result(0, await self._agent(env))
            case ["rm", rel]:
                ToyWriter(self.remote).remove(rel)
            case ["echo", *words, ">", rel]:
                self.remote[rel] = (" ".join(words) + "\n").encode()
            case ["test", "-f", rel]:
                return _result(int(rel not in self.remote))
            case ["test", "!", "-f", rel]:
                return _result(int(rel in self.remote))
            case _:
                return _result(127, f"toy: {argv[0]}: command not found")
        return _result(0)

    async def _agent(self, env: dict[str, str]) -> str:
        """The model loop, over the session's model-API view (all the sandbox may reach)."""
        assert self.model_api is not None, "a node gives every runtime its session's view"
        messages: list[dict[str, Any]] = [{"role": "user", "content": env["POLAR_INSTRUCTION"]}]
        tools = [{"type": "function", "function": {"name": "run", "parameters": {}}}]
        transport = httpx.ASGITransport(app=self.model_api)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, timeout=30) as client:
            for _ in range(4):
                reply = await client.post(
                    env["OPENAI_BASE_URL"] + "/chat/completions",
                    headers={"authorization": "Bearer " + env["OPENAI_API_KEY"]},
                    json={"model": "polar", "messages": messages, "tools": tools},
                )
                reply.raise_for_status()
                self.calls += 1
                message = reply.json()["choices"][0]["message"]
                messages.append({k: v for k, v in message.items() if v is not None})
                if not message.get("tool_calls"):
                    return str(message["content"])
                for call in message["tool_calls"]:
                    argv = shlex.split(json.loads(call["function"]["arguments"])["command"])
                    done = await self._run(argv, env)
                    messages.append(
                        {"role": "tool", "tool_call_id": call["id"], "content": done.stdout}
                    )
        raise AssertionError("the model never stopped calling tools")


def _result(code: int, stdout: str = "") -> ExecResult:
    return ExecResult(exit_code=code, stdout=stdout, stderr="", duration_s=0.0, timed_out=False)


@pytest.fixture
def toy_remote() -> Iterator[list[ToyRemoteRuntime]]:
    ToyRemoteRuntime.built.clear()
    RUNTIMES.add("toy_remote", ToyRemoteRuntime)  # the one registry line
    yield ToyRemoteRuntime.built
    RUNTIMES.remove("toy_remote")


@pytest.fixture
def cluster(tmp_path: Path, tokenizer: Any) -> Iterator[Cluster]:
    c = start_cluster(tmp_path, tokenizer, node_ids=("a",))
    yield c
    c.stop()


def test_a_remote_runtime_runs_a_whole_session_on_a_node_with_no_host_path(
    toy_remote: list[ToyRemoteRuntime], cluster: Cluster
) -> None:
    task = shell_task(
        "remote",
        cluster.receiver,
        num_samples=1,
        runtime={"kind": "toy_remote", "files": STARTING_TREE},
        evaluator={
            "strategy": "test_on_output",
            "refresh_runtime": True,
            "config": {"command": GRADE, "protected": ["tests"]},
        },
    )
    task["agent"]["settings"]["command"] = HARNESS
    reply = cluster.submit(task)
    assert reply.status_code == 201, reply.text
    [raw] = cluster.wait_task("remote", timeout_s=60)["results"]
    result = SessionResult.model_validate(raw)

    assert result.status == SessionStatus.COMPLETED, result.error
    assert result.reward == 1.0 and result.passed, result.evaluation
    assert result.session_dir is None  # nothing of the session is on the node's disk
    assert result.evaluation is not None
    details = result.evaluation.details
    assert details["refreshed"] is True
    assert sorted(details["applied"]) == ["hello.txt", "notes.txt"]  # made, and deleted
    assert details["protected_changes_discarded"] == ["tests/check.txt"]

    session, fresh = toy_remote  # the session's runtime, then the evaluator's fresh one
    assert session.calls == 2  # a tool call, then the final answer
    assert session.remote["hello.txt"] == b"hello\n"  # the model's tool call, run by the toy
    assert session.made == [
        f"{session.home}/.polar/artifacts",
        f"{session.home}/.polar/logs",
    ]
    # The fresh runtime got the agent's changes, not its edit of a protected test.
    assert fresh.remote == {"hello.txt": b"hello\n", "tests/check.txt": b"honest\n"}
    work_dir = cluster.tmp / "node-a" / "sessions"  # no session dir, no evaluation copy
    assert not list(work_dir.glob(f"{path_segment(result.session_id)}*"))

    trajectory = result.trajectory
    assert trajectory is not None and trajectory.status == "COMPLETED"
    [trace] = trajectory.traces  # two calls merged into one trace
    assert trace.metadata["num_calls"] == 2 and trace.reward == 1.0
    records = cluster.nodes["a"].store.records(result.session_id)
    sampled = [t for rec in records for t in rec.sampled_ids]
    trainable = [t for t, m in zip(trace.response_ids, trace.loss_mask, strict=True) if m]
    assert trainable == sampled  # exactly the engine's sampled tokens


def test_a_host_path_asked_of_a_runtime_without_one_names_it(tmp_path: Path) -> None:
    class Remote(ToyRemoteRuntime):
        workspace_path = Runtime.workspace_path  # the interface's own answer, not the toy's
        home_path = Runtime.home_path

    runtime = Remote(RuntimeSpec(kind="toy_remote"), tmp_path / "never", "http://127.0.0.1:9")
    for ask in (
        lambda: runtime.workspace_path,
        lambda: runtime.home_path,
        lambda: runtime.host_path("a.txt"),
    ):
        with pytest.raises(ConfigError, match="toy_remote runtime keeps its files off this host"):
            ask()
    assert create_runtime(RuntimeSpec(kind="local"), tmp_path / "l", "http://x").host_files
