"""A stand-in for a pod or a sandbox service: a runtime that keeps no host path.

The workspace is a dict held "over there", the commands it is sent are run by the toy itself
(a small shell of its own: ``agent``, ``echo WORDS > PATH``, ``rm PATH``, ``test [!] -f PATH``,
joined by ``&&``), and anything that asks it for a host path fails the test. It joins the
registry by one line (:func:`registered`).
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, NoReturn

import httpx

from polar.runtimes.base import Capabilities, ExecResult, Launch, Runtime
from polar.runtimes.registry import RUNTIMES
from polar.runtimes.snapshot import MemorySnapshot, WorkspaceSnapshot
from polar.runtimes.workspace_writer import WorkspaceWriter


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

    async def download(self, remote: str, local: Path) -> None:
        rel = posixpath.relpath(self.inside_path(remote), self.workdir)
        if rel not in self.remote:
            raise FileNotFoundError(f"{remote} is not in the toy's workspace")
        local.write_bytes(self.remote[rel])

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


@contextlib.contextmanager
def registered() -> Iterator[list[ToyRemoteRuntime]]:
    """The toy in the runtime registry; yields every toy built meanwhile, to look inside."""
    ToyRemoteRuntime.built.clear()
    RUNTIMES.add(ToyRemoteRuntime.name, ToyRemoteRuntime)  # the one registry line
    try:
        yield ToyRemoteRuntime.built
    finally:
        RUNTIMES.remove(ToyRemoteRuntime.name)
