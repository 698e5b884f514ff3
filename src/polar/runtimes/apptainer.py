"""Rootless Apptainer, driven through the ``apptainer`` CLI: one ``apptainer exec`` per command.

Each exec runs ``apptainer exec --containall --writable-tmpfs`` on ``spec.image`` (a ``.sif``
file, a sandbox directory, or a ``docker://`` reference): its own PID and IPC namespaces, a
clean environment, the image's filesystem with a throwaway writable layer, the session's
workspace bound at ``spec.workdir`` and its home at ``/home/polar``. Like bubblewrap, processes
end with their exec.

``network="gateway"`` adds ``--net --network none`` (loopback only, allowed unprivileged) and
wraps the command in the gateway forwarder, which runs on the image's ``python3`` (or
``options.forwarder_python``). ``network="host"`` shares the host's network.

Environment values travel as ``APPTAINERENV_<NAME>`` in the CLI's environment, which Apptainer
injects past ``--cleanenv``, so they never appear on a command line. ``--cpus`` and
``--memory`` are passed when the spec sets limits; rootless, Apptainer enforces them only where
cgroups v2 is delegated to the user (systemd), and fails the exec otherwise.

A workspace source of kind ``image`` is copied with the image's own ``cp -a`` into the
workspace (bound at :data:`SEED_INSIDE` for that one exec) before the first command runs.

Options: ``apptainer`` (the binary), ``exec_args`` (extra ``apptainer exec`` arguments),
``forwarder_python``, ``gateway_port``.
"""

from __future__ import annotations

import os
import shutil

from pydantic import Field

from polar.errors import ConfigError, RuntimeStartError
from polar.runtimes.base import SEED_TIMEOUT_S, Launch
from polar.runtimes.container_cli import run_cli_checked
from polar.runtimes.gateway_relay import (
    FORWARDER_INSIDE,
    FORWARDER_SOURCE,
    RUN_INSIDE,
)
from polar.runtimes.sandboxed import ImageOptions, SandboxedRuntime

ENV_PREFIX = "APPTAINERENV_"
# Where the workspace is bound while an image workspace source is copied into it.
SEED_INSIDE = "/.polar/seed"


class ApptainerOptions(ImageOptions):
    apptainer: str = "apptainer"  # the CLI binary
    exec_args: list[str] = Field(
        default_factory=list, description="Extra apptainer exec arguments."
    )


class ApptainerRuntime(SandboxedRuntime):
    name = "apptainer"
    needs_image = True
    options_model = ApptainerOptions
    options: ApptainerOptions

    def _configure(self) -> None:
        super()._configure()
        if not self.spec.image:
            raise ConfigError("the apptainer runtime needs runtime.image (.sif, dir, docker://)")
        self.apptainer = self.options.apptainer
        self.exec_args = self.options.exec_args
        self.forwarder_python = self.options.forwarder_python

    def exec_argv(self, argv: list[str], cwd: str) -> list[str]:
        """The ``apptainer exec`` command line running ``argv`` in ``cwd``."""
        args = [self.apptainer, "exec", "--containall", "--writable-tmpfs", "--pwd", cwd]
        args += ["--home", f"{self.home_path}:{self.home}"]
        args += ["--bind", f"{self.workspace_path}:{self.workdir}"]
        if self.relay is not None:
            args += ["--net", "--network", "none"]
            args += ["--bind", f"{FORWARDER_SOURCE}:{FORWARDER_INSIDE}:ro"]
            args += ["--bind", f"{self.relay.host_dir}:{RUN_INSIDE}"]
            argv = self.relay.wrap(argv, self.forwarder_python)
        if self.spec.cpus is not None:
            args += ["--cpus", f"{self.spec.cpus:g}"]
        if self.spec.memory_mb is not None:
            args += ["--memory", f"{self.spec.memory_mb}M"]
        return [*args, *self.exec_args, self.spec.image or "", *argv]

    def seed_argv(self, path: str) -> list[str]:
        """``apptainer exec``: copy the image's ``path`` into the workspace, bound elsewhere so
        the image's own directory stays visible."""
        args = [self.apptainer, "exec", "--containall"]
        args += ["--bind", f"{self.workspace_path}:{SEED_INSIDE}", *self.exec_args]
        return [*args, self.spec.image or "", "cp", "-a", f"{path.rstrip('/')}/.", SEED_INSIDE]

    async def _seed_from_image(self, path: str) -> None:
        self._need_cli()
        failure = f"copying {path} out of the image {self.spec.image!r} failed"
        await run_cli_checked(self.seed_argv(path), failure, timeout_s=SEED_TIMEOUT_S)

    def _need_cli(self) -> None:
        if shutil.which(self.apptainer) is None:
            raise RuntimeStartError(f"the apptainer runtime needs the {self.apptainer!r} CLI")

    def _launch(self, argv: list[str], env: dict[str, str], cwd: str, exec_id: str) -> Launch:
        client_env = {
            name: value for name, value in os.environ.items() if not name.startswith(ENV_PREFIX)
        }
        # HOME comes from --home; Apptainer refuses to take it from APPTAINERENV_HOME.
        client_env.update(
            {ENV_PREFIX + name: value for name, value in env.items() if name != "HOME"}
        )
        return Launch(self.exec_argv(argv, cwd), client_env)

    async def _boot(self) -> None:
        self._need_cli()
        await run_cli_checked([self.apptainer, "--version"], "apptainer --version failed")
        if self.relay is not None:
            await self.relay.start()

    async def _shutdown(self) -> None:
        if self.relay is not None:
            await self.relay.stop()
