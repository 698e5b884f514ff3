"""Docker, driven through the ``docker`` CLI: one long-lived container per session.

``start`` runs the container detached with the session's workspace mounted at ``spec.workdir``
and its home at ``/home/polar``; each exec is a ``docker exec`` into it, so background processes
persist between execs; ``stop`` removes the container (``docker rm -f``). CPU and memory limits
are Docker's own (``--cpus``, ``--memory``, cgroup-enforced).

``network="gateway"`` runs the container with ``--network none`` (loopback only); its main
process is the gateway forwarder (``python3`` from the image, or ``options.forwarder_python``),
which listens on ``127.0.0.1:gateway_port`` and pipes to the relay's unix socket mounted from
the session dir (what the socket serves: :mod:`polar.runtimes.gateway_relay`). ``network="host"``
uses ``--network host`` and the gateway URL as is.

The container runs as ``options.user`` (default ``65534:65534``; ``null`` keeps the image's
own user) with ``--cap-drop ALL`` and ``--security-opt no-new-privileges``. The workspace and
home are handed to that user before the container starts and after each upload: chowned when
Polar runs as root and the user is numeric, else made writable to all (``a+rwX``).

Exec environment values travel in the docker client's environment (``-e NAME`` without a
value), never on its command line. Each exec is tagged with ``POLAR_EXEC_ID`` so a timeout or
cancel can kill exactly its processes inside the container, not only the client.

A workspace source of kind ``image`` is copied out of the image before the container starts
(``docker create``, ``docker cp``, ``docker rm``): the workspace mount would hide it after.

Options: ``docker`` (the binary), ``user``, ``run_args`` (extra ``docker run`` arguments,
e.g. ``["--shm-size", "1g"]``), ``forwarder_python``, ``gateway_port``.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shutil
from dataclasses import replace
from pathlib import Path

from pydantic import Field

from polar.errors import ConfigError, RuntimeStartError
from polar.runtimes.base import SEED_TIMEOUT_S, Capabilities, Launch
from polar.runtimes.container_cli import run_cli, run_cli_checked
from polar.runtimes.gateway_relay import (
    FORWARDER_INSIDE,
    FORWARDER_SOURCE,
    RUN_INSIDE,
)
from polar.runtimes.safe_files import hand_over_tree
from polar.runtimes.sandboxed import ImageOptions, SandboxedRuntime
from polar.runtimes.spawn import Child

EXEC_ID_VAR = "POLAR_EXEC_ID"
# Kills every process whose environment carries one of the given exec ids ($@).
_KILL_TAGGED = (
    'for d in /proc/[0-9]*; do for id in "$@"; do '
    f'if tr "\\000" "\\n" < "$d/environ" 2>/dev/null | grep -qx "{EXEC_ID_VAR}=$id"; then '
    'kill -9 "${d#/proc/}" 2>/dev/null; fi; done; done'
)


DEFAULT_USER = "65534:65534"


class DockerOptions(ImageOptions):
    docker: str = "docker"  # the CLI binary
    pids_limit: int | None = Field(
        4096, gt=0, description="Processes the container may hold (a fork bomb stays inside)."
    )
    user: str | None = Field(
        DEFAULT_USER, description="uid[:gid] the container runs as; null: the image's user."
    )
    run_args: list[str] = Field(default_factory=list, description="Extra docker run arguments.")


class DockerRuntime(SandboxedRuntime):
    name = "docker"
    needs_image = True
    options_model = DockerOptions
    options: DockerOptions

    def _configure(self) -> None:
        super()._configure()
        if not self.spec.image:
            raise ConfigError("the docker runtime needs runtime.image")
        self.docker = self.options.docker
        self.user = self.options.user
        self.run_args = self.options.run_args
        self.forwarder_python = self.options.forwarder_python
        slug = re.sub(r"[^a-zA-Z0-9_.-]", "-", self.session_dir.name)[:40]
        self.container = f"polar-{slug}-{secrets.token_hex(4)}"
        self._created = False

    @property
    def capabilities(self) -> Capabilities:
        return replace(super().capabilities, persistent_processes=True)

    # -- command lines (pure, unit-tested) ---------------------------------------------------

    def run_argv(self) -> list[str]:
        """``docker run``: detached, named, labelled, limited, with the session mounts."""
        argv = [self.docker, "run", "-d", "--name", self.container]
        argv += ["--label", f"polar.session={self.session_dir.name}"]
        argv += ["--network", "none" if self.relay else "host"]
        if self.user is not None:
            argv += ["--user", self.user]
        argv += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        if self.options.pids_limit is not None:
            argv += ["--pids-limit", str(self.options.pids_limit)]
        if self.spec.cpus is not None:
            argv += ["--cpus", f"{self.spec.cpus:g}"]
        if self.spec.memory_mb is not None:
            argv += ["--memory", f"{self.spec.memory_mb}m"]
        argv += ["-v", f"{self.workspace_path}:{self.workdir}"]
        argv += ["-v", f"{self.home_path}:{self.home}"]
        if self.relay is not None:
            argv += ["-v", f"{FORWARDER_SOURCE}:{FORWARDER_INSIDE}:ro"]
            argv += ["-v", f"{self.relay.host_dir}:{RUN_INSIDE}"]
        argv += ["-w", self.workdir, *self.run_args]
        main = (
            self.relay.forwarder_argv(self.forwarder_python)
            if self.relay
            else ["sleep", "infinity"]
        )
        return [*argv, "--entrypoint", main[0], self.spec.image or "", *main[1:]]

    def exec_argv(self, argv: list[str], env_names: list[str], cwd: str) -> list[str]:
        """``docker exec``: values of ``env_names`` come from the client's environment."""
        names = [EXEC_ID_VAR, *(name for name in env_names if name != EXEC_ID_VAR)]
        env_args = [arg for name in names for arg in ("-e", name)]
        return [self.docker, "exec", "-i", "-w", cwd, *env_args, self.container, *argv]

    def kill_argv(self, exec_ids: list[str]) -> list[str]:
        return [self.docker, "exec", self.container, "sh", "-c", _KILL_TAGGED, "sh", *exec_ids]

    def cp_argv(self, src: str, dst: str) -> list[str]:
        return [self.docker, "cp", src, dst]

    def rm_argv(self) -> list[str]:
        return [self.docker, "rm", "-f", self.container]

    def seed_create_argv(self, name: str) -> list[str]:
        """``docker create``: a container never started, only to copy a directory out of."""
        return [self.docker, "create", "--name", name, "--network", "none",
                "--label", f"polar.session={self.session_dir.name}",
                "--entrypoint", "true", self.spec.image or ""]  # fmt: skip

    # -- lifecycle ---------------------------------------------------------------------------

    def _launch(self, argv: list[str], env: dict[str, str], cwd: str, exec_id: str) -> Launch:
        client_env = {**os.environ, **env, EXEC_ID_VAR: exec_id}
        # The client must keep reading its own config even when the exec overrides HOME.
        client_env["DOCKER_CONFIG"] = os.environ.get("DOCKER_CONFIG", str(Path.home() / ".docker"))
        return Launch(self.exec_argv(argv, sorted(env), cwd), client_env)

    async def _seed_from_image(self, path: str) -> None:
        """Copy the image's ``path`` out through a created, never started container, before
        the workspace mount hides it."""
        self._need_cli()
        name = f"{self.container}-seed"
        await run_cli_checked(
            self.seed_create_argv(name), f"docker create of {self.spec.image!r} failed"
        )
        try:
            argv = self.cp_argv(f"{name}:{path.rstrip('/')}/.", str(self.workspace_path))
            failure = f"copying {path} out of the image {self.spec.image!r} failed"
            await run_cli_checked(argv, failure, timeout_s=SEED_TIMEOUT_S)
        finally:
            await run_cli([self.docker, "rm", "-f", name])

    def _need_cli(self) -> None:
        if shutil.which(self.docker) is None:
            raise RuntimeStartError(f"the docker runtime needs the {self.docker!r} CLI")

    async def _boot(self) -> None:
        self._need_cli()
        if self.relay is not None:
            await self.relay.start()
        await asyncio.to_thread(self._hand_over, self.workspace_path, self.home_path)
        await run_cli_checked(self.run_argv(), f"docker run of {self.spec.image!r} failed")
        self._created = True

    async def _shutdown(self) -> None:
        if self._created:
            await run_cli(self.rm_argv())
            self._created = False
        if self.relay is not None:
            await self.relay.stop()

    async def _kill(self, exec_id: str, proc: Child) -> None:
        await super()._kill(exec_id, proc)
        await run_cli(self.kill_argv([exec_id]), timeout_s=30)

    # -- file transfer -----------------------------------------------------------------------

    async def upload(self, local: Path, remote: str) -> None:
        """Mounted paths are copied on the host; anything else goes through ``docker cp``."""
        try:
            self.host_path(remote)
        except ValueError:
            target = self.inside_path(remote)
            await self.exec(["mkdir", "-p", os.path.dirname(target)])
            src = f"{local}/." if Path(local).is_dir() else str(local)
            await self._cp(src, f"{self.container}:{target}")
            return
        await super().upload(local, remote)
        await asyncio.to_thread(self._hand_over, self.host_path(remote))

    async def download(self, remote: str, local: Path) -> None:
        try:
            self.host_path(remote)
        except ValueError:
            source = self.inside_path(remote)
            if (await self.exec(["test", "-d", source])).ok:
                source += "/."
            Path(local).parent.mkdir(parents=True, exist_ok=True)
            await self._cp(f"{self.container}:{source}", str(local))
            return
        await super().download(remote, local)

    def _hand_over(self, *paths: Path) -> None:
        """Make ``paths`` (trees in the workspace or home) writable by the container's user,
        never through a link the container planted."""
        owner = _numeric_owner(self.user) if os.geteuid() == 0 else None
        for top in paths:
            root = self.workspace_path if top.is_relative_to(self.workspace_path) else None
            if root is None and top.is_relative_to(self.home_path):
                root = self.home_path
            hand_over_tree(top, owner, root=root)

    async def _cp(self, src: str, dst: str) -> None:
        code, _, err = await run_cli(self.cp_argv(src, dst))
        if code != 0:
            raise FileNotFoundError(f"docker cp {src} {dst} failed: {err.strip()}")


def _numeric_owner(user: str | None) -> tuple[int, int] | None:
    """(uid, gid) of a numeric ``uid[:gid]``; None for names or the image's own user."""
    if user is None:
        return None
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or (gid and not gid.isdigit()):
        return None
    return int(uid), int(gid or uid)
