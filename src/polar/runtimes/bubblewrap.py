"""Bubblewrap (``bwrap``): a rootless sandbox with no daemon, on the host's own system.

Each exec is a fresh sandbox: the host's ``/usr`` and the ``/bin``, ``/lib*`` links read-only,
a read-only ``/etc`` holding only what programs need from the host's (:data:`ETC_ENTRIES`: name
resolution, CA certificates, the dynamic loader's cache, locale and time zone, the shell
profile, ``alternatives``) and a ``passwd``/``group`` of its own, the session's workspace
writable at ``spec.workdir`` and its home at ``/home/polar``, a private ``/tmp``, new ``/proc``
and ``/dev``, and its own user, PID, IPC and UTS namespaces. With ``network="gateway"`` it also
gets its own network namespace, where only loopback exists; the gateway is forwarded in through
a unix socket (see :mod:`polar.runtimes.gateway_relay`), and every other address, the host's
loopback services included, is unreachable.

Processes inside run as uid/gid :data:`SANDBOX_UID` (``polar``) in a user namespace with every
capability dropped, and see only the environment the exec passes (the runtime's defaults,
``spec.env`` and the preset's), never the host's. The namespace maps that uid to the user that
runs Polar, so files that user owns stay readable inside if they are bound; that is why the
host's ``/etc/shadow``, ``/etc/gshadow``, ``/etc/ssl/private``, ``/root`` and home directories
are never bound.

The host's Python (``sys.base_prefix``) is bound read-only because the in-sandbox forwarder
runs on it; with ``options.host_python`` (default true) the active virtualenv is bound too and
its ``bin`` leads PATH, so tests can run with the project's interpreter.

Options: ``ro_binds`` (host paths, or ``src:dest``, bound read-only, e.g. a Node install),
``host_python``, ``gateway_port`` (the loopback port inside), ``bwrap`` (the binary).

Limits: every exec's processes die with it (the PID namespace ends), so background services do
not persist between execs. CPU and memory limits are rootless approximations
(:mod:`polar.runtimes.limits`). The bound system directories (``/usr``, the Python and
``ro_binds`` paths) are read with the rights of the user running Polar: run Polar as an
unprivileged user where those hold owner-only files.
"""

from __future__ import annotations

import asyncio
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

_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SANDBOX_UID = 65534
SANDBOX_USER = "polar"
# What programs need from the host's /etc; nothing that holds a secret (no shadow, no
# ssl/private, no pip.conf/npmrc with index credentials, no ssh host keys).
ETC_ENTRIES = (
    "hosts",
    "host.conf",
    "resolv.conf",
    "nsswitch.conf",
    "gai.conf",
    "protocols",
    "services",
    "networks",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/tls/certs",
    "pki/ca-trust/extracted",
    "alternatives",
    "localtime",
    "timezone",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "locale.conf",
    "os-release",
    "debian_version",
    "lsb-release",
    "profile",
    "profile.d",
    "bash.bashrc",
    "inputrc",
    "terminfo",
    "mime.types",
    "fonts",
)


def _etc_binds(run_dir: Path, root: Path = Path("/")) -> list[str]:
    """A read-only /etc of the host's :data:`ETC_ENTRIES` that exist, and the sandbox's own
    passwd and group (written by :func:`write_identity`)."""
    args = ["--tmpfs", "/etc"]
    for name in ETC_ENTRIES:
        if (root / "etc" / name).exists():
            args += ["--ro-bind", str(root / "etc" / name), f"/etc/{name}"]
    for name in ("passwd", "group"):
        args += ["--ro-bind", str(run_dir / "etc" / name), f"/etc/{name}"]
    args += ["--symlink", "/proc/self/mounts", "/etc/mtab"]
    return [*args, "--remount-ro", "/etc"]


def write_identity(run_dir: Path, home: str) -> None:
    """The sandbox's /etc/passwd and /etc/group: root, and the user it runs as."""
    etc = run_dir / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    uid, user = SANDBOX_UID, SANDBOX_USER
    (etc / "passwd").write_text(
        f"root:x:0:0:root:/root:/usr/sbin/nologin\n{user}:x:{uid}:{uid}:{user}:{home}:/bin/bash\n"
    )
    (etc / "group").write_text(f"root:x:0:\n{user}:x:{uid}:\n")


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

    def _configure(self) -> None:
        super()._configure()
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
        args = [self.bwrap, *_system_binds(), *_etc_binds(self.run_path)]
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
        uid = str(SANDBOX_UID)
        args += ["--unshare-user", "--uid", uid, "--gid", uid, "--cap-drop", "ALL"]
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
        return {
            **super()._base_env(),
            "PATH": path,
            "TMPDIR": "/tmp",
            "USER": SANDBOX_USER,
            "LOGNAME": SANDBOX_USER,
        }

    def _launch(self, argv: list[str], env: dict[str, str], cwd: str, exec_id: str) -> Launch:
        inner = self.relay.wrap(argv, self.python_inside) if self.relay else argv
        prefix = limit_prefix(self.spec, key=self.session_dir.name)
        return Launch([*prefix, *self.bwrap_argv(cwd), *inner], env, self.session_dir)

    async def _boot(self) -> None:
        for tool in (self.bwrap, *limit_tools(self.spec)):
            if shutil.which(tool) is None:
                hint = " (apt-get install -y bubblewrap)" if tool == self.bwrap else ""
                raise RuntimeStartError(f"the bubblewrap runtime needs {tool!r}{hint}")
        await asyncio.to_thread(write_identity, self.run_path, self.home)
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
