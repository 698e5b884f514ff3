"""Plain host subprocesses in the session dir: for development, with no isolation at all.

The runtime's view is the host's: :attr:`workdir` and :attr:`home` are the session's
``workspace/`` and ``home/`` host paths (``spec.workdir`` is not used), processes can read
anything the user can, and the network is the host's, so the gateway URL is used as is.
Execs get a small environment (PATH, HOME, LANG, TERM) plus ``spec.env``, not the caller's
whole environment, so an API key in the developer's shell does not leak into a harness; set
``options.inherit_env: true`` to pass it all through. CPU and memory limits apply
(see :mod:`polar.runtimes.limits`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath

from polar.errors import RuntimeStartError
from polar.runtimes.base import Capabilities, Launch, Runtime, RuntimeOptions
from polar.runtimes.limits import limit_prefix, limit_tools

_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


class LocalOptions(RuntimeOptions):
    inherit_env: bool = False  # pass the caller's whole environment to execs


class LocalRuntime(Runtime):
    name = "local"
    sandboxed = False
    options_model = LocalOptions
    options: LocalOptions

    @property
    def workdir(self) -> str:
        return str(self.workspace_path)

    @property
    def home(self) -> str:
        return str(self.home_path)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            filesystem_isolation=False,
            network_isolation=False,
            process_isolation=False,
            resource_limits=self.requested_limits,
        )

    def host_path(self, remote: str) -> Path:
        """Inside and host views are the same here."""
        return Path(self.inside_path(remote))

    def host_root(self, remote: str) -> Path:
        """The workspace or home that holds ``remote``; any other path (this runtime has no
        isolation, so nothing outside those is the harness's) is taken from its parent."""
        try:
            return super().host_root(remote)
        except ValueError:
            return self.host_path(remote).parent

    async def _boot(self) -> None:
        for tool in limit_tools(self.spec):
            if shutil.which(tool) is None:
                raise RuntimeStartError(f"resource limits need {tool!r}, which is not installed")

    def _base_env(self) -> dict[str, str]:
        inherited = dict(os.environ) if self.options.inherit_env else {}
        return {
            **inherited,
            "PATH": os.environ.get("PATH", _DEFAULT_PATH),
            **super()._base_env(),
        }

    def _launch(self, argv: list[str], env: dict[str, str], cwd: str, exec_id: str) -> Launch:
        prefix = limit_prefix(self.spec, key=self.session_dir.name)
        return Launch([*prefix, *argv], env, Path(PurePosixPath(cwd)))
