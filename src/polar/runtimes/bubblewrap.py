"""Bubblewrap (``bwrap``): a rootless sandbox with no daemon, on the host's own system.

Each exec is a fresh sandbox: the host's ``/usr``, ``/etc`` and the ``/bin``, ``/lib*`` links
read-only, the session's workspace writable at ``spec.workdir`` and its home at ``/home/polar``,
a private ``/tmp``, new ``/proc`` and ``/dev``, and its own PID, IPC and UTS namespaces. With
``network="gateway"`` it also gets its own network namespace, where only loopback exists; the
gateway is forwarded in through a unix socket (see :mod:`polar.runtimes.gateway_relay`), and
every other address, the host's loopback services included, is unreachable.

The host's Python (``sys.base_prefix``) is bound read-only because the in-sandbox forwarder
runs on it; with ``options.host_python`` (default true) the active virtualenv is bound too and
its ``bin`` leads PATH, so tests can run with the project's interpreter.

Options: ``ro_binds`` (host paths, or ``src:dest``, bound read-only, e.g. a Node install),
``host_python``, ``gateway_port`` (the loopback port inside), ``bwrap`` (the binary).

Limits: every exec's processes die with it (the PID namespace ends), so background services do
not persist between execs. CPU and memory limits are rootless approximations
(:mod:`polar.runtimes.limits`). Run as root, the sandbox's root has no capabilities but can still
read root-only host files under the bound directories; run Polar as an unprivileged user for that.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from pydantic import Field

from polar.errors import ConfigError, RuntimeStartError
from polar.runtimes.base import Launch, tail_text
from polar.runtimes.gateway_relay import (
    FORWARDER_INSIDE,
    FORWARDER_SOURCE,
    RUN_INSIDE,
)
from polar.runtimes.limits import limit_prefix, limit_tools
from polar.runtimes.sandboxed import SandboxedOptions, SandboxedRuntime
from polar.schemas.task import RuntimeSpec

_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _system_binds(root: Path = Path("/")) -> list[str]:
    """Read-only binds of the host's system dirs; merged-/usr links are recreated as links."""
    args: list[str] = []
    for name in _SYSTEM_DIRS:
        host = root / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{name}"]
    return args


def _covered(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


class BubblewrapOptions(SandboxedOptions):
    bwrap: str = "bwrap"  # the binary
    host_python: bool = Field(
        True, description="Bind the active virtualenv too, its bin first on PATH."
    )
    ro_binds: list[str] = Field(
        default_factory=list, description="Host paths (or src:dest) bound read-only."
    )


class BubblewrapRuntime(SandboxedRuntime):
    name = "bubblewrap"
    options_model = BubblewrapOptions
    options: BubblewrapOptions

    def __init__(self, spec: RuntimeSpec, session_dir: Path, gateway_url: str) -> None:
        super().__init__(spec, session_dir, gateway_url)
        if self.spec.image:
            raise ConfigError(
                "the bubblewrap runtime runs on the host's read-only system; runtime.image "
                "is not supported (use docker or apptainer for images)"
            )
        self.bwrap = self.options.bwrap
        self.host_python = self.options.host_python
        self.ro_binds = self.options.ro_binds

    @property
    def python_inside(self) -> list[str]:
        """The interpreter the forwarder runs on: the host's real one, bound read-only."""
        return [os.path.realpath(sys.executable), "-I", "-S"]

    def bwrap_argv(self, cwd: str) -> list[str]:
        """The ``bwrap`` command line (without the command) for one exec in ``cwd``."""
        args = [self.bwrap, *_system_binds()]
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        bound = ["/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]
        for path in self._python_dirs():
            if not _covered(path, bound):
                args += ["--ro-bind", path, path]
                bound.append(path)
        for item in self.ro_binds:
            src, _, dest = item.partition(":")
            args += ["--ro-bind", src, dest or src]
        args += ["--bind", str(self.workspace_path), self.workdir]
        args += ["--bind", str(self.home_path), self.home]
        if self.relay is not None:
            args += ["--ro-bind", str(FORWARDER_SOURCE), FORWARDER_INSIDE]
            args += ["--ro-bind", str(self.relay.host_dir), RUN_INSIDE]
        args += ["--chdir", cwd, "--hostname", "polar"]
        args += ["--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc"]
        args += ["--unshare-uts"]
        if self.relay is not None:
            args.append("--unshare-net")
        return [*args, "--"]

    def _python_dirs(self) -> list[str]:
        interpreter_root = os.path.dirname(os.path.dirname(self.python_inside[0]))
        dirs = [os.path.realpath(sys.base_prefix), interpreter_root]
        if self.host_python:
            dirs.append(os.path.realpath(sys.prefix))
        return list(dict.fromkeys(dirs))

    def _base_env(self) -> dict[str, str]:
        path = _SYSTEM_PATH
        if self.host_python:
            path = f"{os.path.realpath(sys.prefix)}/bin:{path}"
        return {**super()._base_env(), "PATH": path, "TMPDIR": "/tmp"}

    def _launch(self, argv: list[str], env: dict[str, str], cwd: str, exec_id: str) -> Launch:
        inner = self.relay.wrap(argv, self.python_inside) if self.relay else argv
        prefix = limit_prefix(self.spec, key=self.session_dir.name)
        return Launch([*prefix, *self.bwrap_argv(cwd), *inner], env, self.session_dir)

    async def _boot(self) -> None:
        for tool in (self.bwrap, *limit_tools(self.spec)):
            if shutil.which(tool) is None:
                hint = " (apt-get install -y bubblewrap)" if tool == self.bwrap else ""
                raise RuntimeStartError(f"the bubblewrap runtime needs {tool!r}{hint}")
        if self.relay is not None:
            await self.relay.start()
        probe = await self.exec(["true"], timeout_s=60)
        if not probe.ok:
            raise RuntimeStartError(
                "bwrap cannot create a sandbox here; unprivileged user namespaces may be "
                "disabled (Ubuntu 24.04: sysctl kernel.apparmor_restrict_unprivileged_userns=0)",
                command="bwrap ... true",
                exit_code=probe.exit_code,
                stderr_tail=tail_text(probe.stderr),
            )

    async def _shutdown(self) -> None:
        if self.relay is not None:
            await self.relay.stop()
