"""The interface every runtime implements: where a harness runs and how Polar drives it.

A runtime owns one session directory on the host, laid out by :meth:`Runtime.start`::

    session_dir/
      workspace/   the task's working directory (``spec.workdir`` inside), writable
      home/        HOME inside (:attr:`Runtime.home`), writable
      logs/        prepare output
      artifacts/   files a harness or evaluator wants kept
      run/         runtime plumbing (the gateway relay's socket)

The built-in runtimes map ``workspace/`` and ``home/`` into their sandbox, so the host reads
the agent's work directly. A runtime whose sandbox lives elsewhere (a pod, a sandbox service)
sets :attr:`Runtime.host_files` to False and keeps no host path: callers reach its files only
through :meth:`Runtime.workspace_snapshot`, :meth:`Runtime.workspace_writer`,
:meth:`Runtime.make_dirs`, :meth:`Runtime.upload` and :meth:`Runtime.download`, which it
implements its own way, and a host path asked of it is a :class:`ConfigError` naming it.

Paths given to :meth:`exec`, :meth:`upload` and :meth:`download` are in the runtime's view:
relative to the workdir, or absolute inside. String commands run through ``bash -lc``; every
exec is its own process group (or sandbox), killed whole on timeout or cancel, and the output
is captured up to a size cap, so an exec never hangs and never floods memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import secrets
import shlex
import shutil
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from polar.config_loader import parse_config
from polar.errors import ConfigError, RuntimeStartError
from polar.runtimes.checkouts import default_cache_dir, shared_checkout
from polar.runtimes.safe_files import copy_tree, make_dirs
from polar.runtimes.snapshot import HostSnapshot, WorkspaceSnapshot
from polar.runtimes.spawn import Child, spawn
from polar.runtimes.workspace_writer import HostWriter, WorkspaceWriter
from polar.schemas.task import ImageSource, RuntimeSpec

DEFAULT_OUTPUT_LIMIT = 1024 * 1024
DEFAULT_PREPARE_TIMEOUT_S = 1800.0
# After the main process exits, how long stragglers may keep the output pipes open.
_READ_GRACE_S = 1.0
_STDERR_TAIL = 4000
# Copying an image's workspace source out (a large repository's tree) may take a while.
SEED_TIMEOUT_S = 1800.0

AsgiApp = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[MutableMapping[str, Any]]],
        Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ],
    Awaitable[None],
]
"""An ASGI app, typed loosely: runtimes sit below the gateway and never import it."""


@dataclass(frozen=True)
class Capabilities:
    """What a runtime enforces, so callers can refuse a task that needs more."""

    filesystem_isolation: bool
    """The system is read-only and only the session's own directories are writable."""
    network_isolation: bool
    """With ``network="gateway"``, the gateway is the only address reachable from inside."""
    process_isolation: bool
    """Processes inside cannot see or signal the host's processes."""
    resource_limits: frozenset[str] = frozenset()
    """Which of ``cpus`` and ``memory`` are enforced."""
    file_transfer: bool = True
    """upload() and download() work."""
    persistent_processes: bool = False
    """Background processes outlive the exec that started them."""


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    """The process's exit status; negative N when killed by signal N (as in subprocess)."""
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class Launch:
    """How the host starts one exec: the argv, its environment and its host-side cwd."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path | None = None


@dataclass
class _CappedOutput:
    """Keeps the first and last halves of a stream up to ``limit`` bytes: the start of an
    output and its final summary (where test runners print their verdicts) both survive."""

    limit: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0

    def feed(self, chunk: bytes) -> None:
        half = max(self.limit // 2, 1)
        self.total += len(chunk)
        room = half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > 2 * half:
            del self.tail[: len(self.tail) - half]

    def text(self) -> str:
        half = max(self.limit // 2, 1)
        tail = bytes(self.tail[-half:])
        dropped = self.total - len(self.head) - len(tail)
        marker = f"\n[... {dropped} bytes elided ...]\n".encode() if dropped > 0 else b""
        return (bytes(self.head) + marker + tail).decode("utf-8", "replace")


async def _drain_into(stream: asyncio.StreamReader | None, out: _CappedOutput) -> None:
    if stream is None:
        return
    while chunk := await stream.read(64 * 1024):
        out.feed(chunk)


async def _feed_stdin(stream: asyncio.StreamWriter | None, data: bytes) -> None:
    if stream is None:
        return
    try:
        stream.write(data)
        await stream.drain()
        stream.close()
    except OSError:
        pass  # the process exited without reading all of its input


def _killpg(proc: Child) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def tail_text(text: str, limit: int = _STDERR_TAIL) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


class RuntimeOptions(BaseModel):
    """``runtime.options`` every runtime takes; each runtime extends it with its own keys.

    Unknown keys are errors, so a misspelt option fails the build instead of being ignored.
    """

    model_config = ConfigDict(extra="forbid")

    output_limit_bytes: int = Field(
        DEFAULT_OUTPUT_LIMIT, gt=0, description="Output kept per exec stream (head and tail)."
    )
    prepare_timeout_s: float = Field(
        DEFAULT_PREPARE_TIMEOUT_S, gt=0, description="Time limit for each prepare command."
    )


class Runtime(ABC):
    """One session's sandbox: start it, run commands in it, move files, stop it.

    ``spec.options`` is validated as :attr:`options_model` when the runtime is built (a
    ``module:Class`` runtime with options of its own declares its model there).

    ``model_api`` is what a sandbox may reach of the gateway: the session's model-API view, an
    ASGI app a node passes in. Runtimes that cut the network serve it to the sandbox (see
    :mod:`polar.runtimes.gateway_relay`); without one they relay the gateway's whole address.
    """

    name: ClassVar[str]
    needs_image: ClassVar[bool] = False
    """Whether ``spec.image`` is required (a container runtime) rather than the host's system."""
    sandboxed: ClassVar[bool] = True
    """False for a runtime that runs the harness as the node's own user, unconfined (local)."""
    host_files: ClassVar[bool] = True
    """Whether the workspace and home are host directories under :attr:`session_dir` (the
    ``*_path`` properties, :meth:`host_path`); False for a sandbox that lives elsewhere."""
    home_inside: ClassVar[str] = "/home/polar"
    options_model: ClassVar[type[RuntimeOptions]] = RuntimeOptions
    options: RuntimeOptions

    def __init__(
        self,
        spec: RuntimeSpec,
        session_dir: Path,
        gateway_url: str,
        *,
        model_api: AsgiApp | None = None,
    ) -> None:
        self.spec = spec
        self.session_dir = Path(session_dir).absolute()
        self.gateway_url = gateway_url
        self.model_api = model_api
        self.options = parse_config(
            self.options_model, spec.options, what=f"runtime.options for the {self.name} runtime"
        )
        self.output_limit = self.options.output_limit_bytes
        self.prepare_timeout_s = self.options.prepare_timeout_s
        for rel in spec.files:
            _check_relative(rel)
        if spec.network not in ("gateway", "host"):
            raise ConfigError(f"runtime.network must be gateway or host, got {spec.network!r}")
        self._running: dict[str, Child] = {}
        self._started = False
        self._stopped = False
        self._configure()

    def _configure(self) -> None:
        """What a kind adds once its options are parsed (its own checks and fields): the one
        hook a runtime overrides, so the constructor and its signature are written once."""
        return None

    # -- the session directory on the host ---------------------------------------------------

    @property
    def workspace_path(self) -> Path:
        return self._host_dir("workspace")

    @property
    def home_path(self) -> Path:
        return self._host_dir("home")

    @property
    def logs_path(self) -> Path:
        return self._host_dir("logs")

    @property
    def artifacts_path(self) -> Path:
        return self._host_dir("artifacts")

    @property
    def run_path(self) -> Path:
        return self._host_dir("run")

    def _host_dir(self, name: str) -> Path:
        if not self.host_files:
            raise ConfigError(
                f"the {self.name} runtime keeps its files off this host (host_files = False): "
                f"it has no host {name} directory; read its workspace_snapshot() and write "
                "through its workspace_writer(), make_dirs(), upload() and download()"
            )
        return self.session_dir / name

    async def workspace_snapshot(self) -> WorkspaceSnapshot:
        """The agent's workspace as evaluators read it. Here the host's mapped directory; a
        runtime whose sandbox lives elsewhere returns the files it fetched."""
        return HostSnapshot(self.workspace_path)

    def workspace_writer(self) -> WorkspaceWriter:
        """Where an evaluator replays the agent's changes on this (fresh) runtime. Here the
        host's mapped directory; a runtime whose sandbox lives elsewhere sends them there."""
        return HostWriter(self.workspace_path)

    # -- the runtime's view ------------------------------------------------------------------

    @property
    def workdir(self) -> str:
        """The workspace as processes inside see it."""
        return self.spec.workdir

    @property
    def home(self) -> str:
        """HOME as processes inside see it."""
        return self.home_inside

    @property
    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    @property
    def gateway_url_inside(self) -> str:
        """The gateway URL a process inside must use."""
        return self.gateway_url

    @property
    def requested_limits(self) -> frozenset[str]:
        """Which of ``cpus`` and ``memory`` the spec asks for."""
        wanted = (("cpus", self.spec.cpus), ("memory", self.spec.memory_mb))
        return frozenset(name for name, value in wanted if value is not None)

    @property
    def running(self) -> bool:
        return self._started and not self._stopped

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Lay out the session dir, seed the workspace from ``spec.source``, write
        ``spec.files`` over it, boot, and run ``spec.prepare``.

        The same spec always gives the same starting tree, so an evaluator can compare the
        agent's workspace with a fresh runtime's. Raises :class:`RuntimeStartError` (after
        stopping what did start) on any failure.
        """
        if self._started:
            return
        self._started = True
        try:
            await asyncio.to_thread(self._lay_out)
            await self._seed()
            await asyncio.to_thread(self._write_files)
            await self._boot()
            for command in self.spec.prepare:
                await self._prepare(command)
        except OSError as exc:
            await self.stop()
            raise RuntimeStartError(f"{self.name} runtime failed to start: {exc}") from exc
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Kill everything this runtime started and release it; safe to call twice.

        The session directory stays: its owner decides what to keep.
        """
        if self._stopped:
            return
        self._stopped = True
        await self.cancel()
        await self._shutdown()

    async def cancel(self) -> None:
        """Kill the running execs now; each returns with the kill's exit status."""
        for exec_id, proc in list(self._running.items()):
            await self._kill(exec_id, proc)

    # -- commands ----------------------------------------------------------------------------

    async def exec(
        self,
        command: str | list[str],
        *,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run ``command`` inside (a string through ``bash -lc``, a list as argv)."""
        if not self.running:
            raise RuntimeStartError(f"{self.name} runtime is not running (start() first)")
        full_env = {**self._base_env(), **self.spec.env, **(env or {})}
        argv = self._shell_argv(command, full_env) if isinstance(command, str) else list(command)
        exec_id = secrets.token_hex(8)
        launch = self._launch(argv, full_env, self.inside_path(cwd or "."), exec_id)
        return await self._run(launch, exec_id, timeout_s, stdin)

    def inside_path(self, path: str) -> str:
        """``path`` made absolute in the runtime's view (relative means under the workdir)."""
        return posixpath.normpath(posixpath.join(self.workdir, path))

    async def upload(self, local: Path, remote: str) -> None:
        """Copy a host file or directory to ``remote`` inside, never through a link in the
        sandbox's tree (the host side is the caller's own path, taken as it stands)."""
        local = Path(local).absolute()
        root, target = self.host_root(remote), self.host_path(remote)
        await asyncio.to_thread(copy_tree, local, target, src_root=local.parent, dst_root=root)

    async def download(self, remote: str, local: Path) -> None:
        """Copy ``remote`` (file or directory) from inside to the host path ``local``, never
        through a link in any component of ``remote`` beneath the workspace or home."""
        local = Path(local).absolute()
        root, source = self.host_root(remote), self.host_path(remote)
        local.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(copy_tree, source, local, src_root=root, dst_root=local.parent)

    async def make_dirs(self, *paths: str) -> None:
        """Make each directory (inside paths) with its parents, never through a link the
        sandbox planted (:class:`UnsafeFile`); only the workdir and home are writable."""
        for path in paths:
            root, rel = self._mapped(path)
            await asyncio.to_thread(make_dirs, root, rel)

    def host_path(self, remote: str) -> Path:
        """Where an inside path lives on the host; only the workspace and home are mapped."""
        root, rel = self._mapped(remote)
        return _within(root, root / rel, remote)

    def host_root(self, remote: str) -> Path:
        """The host directory (workspace or home) that holds ``remote``: host-side reads and
        writes of ``remote`` resolve beneath it (:mod:`polar.runtimes.safe_files`)."""
        return self._mapped(remote)[0]

    def _mapped(self, remote: str) -> tuple[Path, str]:
        """The host directory that holds ``remote`` (workspace or home) and the path below it."""
        inside = PurePosixPath(self.inside_path(remote))
        for root, host in ((self.workdir, self.workspace_path), (self.home, self.home_path)):
            if inside == PurePosixPath(root) or PurePosixPath(root) in inside.parents:
                return host, str(inside.relative_to(root))
        raise ValueError(
            f"{remote!r} is outside the {self.name} runtime's workdir ({self.workdir}) and "
            f"home ({self.home}); only those can be transferred"
        )

    # -- what each runtime provides ----------------------------------------------------------

    @abstractmethod
    def _launch(self, argv: list[str], env: dict[str, str], cwd: str, exec_id: str) -> Launch:
        """The host command that runs ``argv`` inside with ``env`` in ``cwd`` (inside view)."""

    def _base_env(self) -> dict[str, str]:
        """Variables every exec gets before ``spec.env`` and the exec's own."""
        return {"HOME": self.home, "LANG": "C.UTF-8", "TERM": "dumb"}

    async def _seed_from_image(self, path: str) -> None:
        """Copy the image's directory ``path`` into the workspace (runtimes with an image)."""
        raise ConfigError(
            f"the {self.name} runtime has no image: an image workspace source needs docker "
            "or apptainer"
        )

    async def _boot(self) -> None:  # noqa: B027 - runtimes without a daemon have nothing to boot
        """Bring the sandbox up after the session dir is laid out."""

    async def _shutdown(self) -> None:  # noqa: B027 - as above
        """Release what :meth:`_boot` acquired."""

    async def _kill(self, exec_id: str, proc: Child) -> None:
        """Kill one exec entirely (default: its host process group)."""
        _killpg(proc)

    # -- shared machinery --------------------------------------------------------------------

    def _shell_argv(self, command: str, env: dict[str, str]) -> list[str]:
        # A login shell's /etc/profile resets PATH (Debian's does): put the exec's PATH back in
        # front so spec.env and the runtime's defaults win over the image's profile.
        if "PATH" in env:
            command = f'export PATH={shlex.quote(env["PATH"])}:"$PATH"\n{command}'
        return ["bash", "-lc", command]

    def _lay_out(self) -> None:
        for path in (
            self.workspace_path,
            self.home_path,
            self.logs_path,
            self.artifacts_path,
            self.run_path,
        ):
            path.mkdir(parents=True, exist_ok=True)

    async def _seed(self) -> None:
        """Lay the starting tree of ``spec.source`` into the workspace."""
        source = self.spec.source
        if source is None:
            return
        if isinstance(source, ImageSource):
            await self._seed_from_image(source.path or self.spec.workdir)
            return
        tree = await shared_checkout(source.repo, source.commit, default_cache_dir())
        await asyncio.to_thread(
            shutil.copytree, tree, self.workspace_path, symlinks=True, dirs_exist_ok=True
        )

    def _write_files(self) -> None:
        for rel, content in self.spec.files.items():
            target = self.workspace_path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)

    async def _prepare(self, command: str) -> None:
        result = await self.exec(command, timeout_s=self.prepare_timeout_s)
        with (self.logs_path / "prepare.log").open("a") as log:
            log.write(f"$ {command}\n{result.stdout}{result.stderr}[exit {result.exit_code}]\n")
        if result.ok:
            return
        what = (
            f"timed out after {self.prepare_timeout_s:g}s"
            if result.timed_out
            else f"exited with {result.exit_code}"
        )
        raise RuntimeStartError(
            f"prepare step {command!r} {what}",
            command=command,
            exit_code=result.exit_code,
            stderr_tail=tail_text(result.stderr or result.stdout),
        )

    async def _run(
        self, launch: Launch, exec_id: str, timeout_s: float | None, stdin: bytes | None
    ) -> ExecResult:
        began = time.monotonic()
        starting = asyncio.ensure_future(
            spawn(
                launch.argv,
                env=launch.env,
                cwd=launch.cwd,
                with_stdin=stdin is not None,
                new_session=True,
            )
        )
        try:
            proc = await asyncio.shield(starting)
        except asyncio.CancelledError:
            # Cancelled while the process was being spawned: it exists already and nothing else
            # knows of it (asyncio would kill only the direct child, not what it started), so
            # let the spawn finish and kill the whole group here.
            with contextlib.suppress(Exception):
                orphan = await starting
                _killpg(orphan)
                await orphan.exited()
                orphan.close()
            raise
        except OSError as exc:
            code = 126 if isinstance(exc, PermissionError) else 127
            return ExecResult(code, "", f"{launch.argv[0]}: {exc}", time.monotonic() - began, False)
        self._running[exec_id] = proc
        out, err = _CappedOutput(self.output_limit), _CappedOutput(self.output_limit)
        readers = asyncio.gather(_drain_into(proc.stdout, out), _drain_into(proc.stderr, err))
        feeder = asyncio.ensure_future(_feed_stdin(proc.stdin, stdin or b""))
        timed_out = False
        try:
            try:
                async with asyncio.timeout(timeout_s):
                    await proc.exited()
            except TimeoutError:
                timed_out = True
                await self._kill(exec_id, proc)
            code = await proc.exited()
            # The main process is gone: end what it left in its group so the pipes close.
            _killpg(proc)
            await asyncio.wait([readers], timeout=_READ_GRACE_S)
        except asyncio.CancelledError:
            await asyncio.shield(self._kill(exec_id, proc))
            raise
        finally:
            for task in (readers, feeder):
                task.cancel()
                # a pipe error after the process ended is not this exec's result: retrieve it
                # so asyncio does not report it as "never retrieved"
                task.add_done_callback(_retrieve)
            self._running.pop(exec_id, None)
            proc.close()
        return ExecResult(code, out.text(), err.text(), time.monotonic() - began, timed_out)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _check_relative(rel: str) -> None:
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ConfigError(f"runtime.files key {rel!r} must be a relative path inside the workdir")


def _within(root: Path, path: Path, remote: str) -> Path:
    """``path`` if it stays under ``root`` once symbolic links are resolved. The harness owns
    the workspace: a link it planted (``tests -> /etc``) must not turn a transfer, which runs
    with the node's rights on the host, into a read or write of host files."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip("/") + "/"):
        raise ValueError(
            f"{remote!r} leads outside the runtime's workspace through a symbolic link; "
            "it is not transferred"
        )
    return path
