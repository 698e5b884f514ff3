"""Where the agent's changes land: a fresh runtime's workspace, written by relative path.

The other direction of :mod:`polar.runtimes.snapshot`. An evaluator grading on a clean copy
(``refresh_runtime``) replays the agent's diff onto a fresh runtime through
``Runtime.workspace_writer()``, never through a host path, so a runtime whose sandbox lives
elsewhere (a pod, a sandbox service) returns a writer that sends each change there.
:class:`HostWriter` writes a host directory (the local, bubblewrap, docker and apptainer
runtimes map the workspace there). The methods block: callers run them in a worker thread.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from pathlib import Path

from polar.runtimes.snapshot import WorkspaceSnapshot


class WorkspaceWriter(ABC):
    """Changes to one workspace by ``/``-separated relative path; an :class:`OSError` means
    the change could not be made (the caller reports it as a conflict)."""

    @abstractmethod
    def remove(self, rel: str) -> None:
        """Delete the file, link or directory tree at ``rel`` (nothing there is no error)."""

    @abstractmethod
    def write(self, rel: str, source: WorkspaceSnapshot) -> None:
        """Put ``source``'s regular file at ``rel`` (bytes and executable bit) in place of
        what is there, parents made; an empty directory in the way is replaced, a full one
        is an :class:`OSError`."""

    @abstractmethod
    def link(self, rel: str, target: str) -> None:
        """Put a symbolic link to ``target`` at ``rel``, as :meth:`write` puts a file."""

    @abstractmethod
    def remove_empty_dir(self, rel: str) -> bool:
        """Remove the directory at ``rel`` if it is empty; whether it was removed."""


class HostWriter(WorkspaceWriter):
    """A workspace the host sees as a directory. Files are written through
    :mod:`polar.runtimes.safe_files` (never through a link), links are made as links."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def remove(self, rel: str) -> None:
        path = self.root / rel
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()

    def write(self, rel: str, source: WorkspaceSnapshot) -> None:
        source.copy_to(rel, self._clear(rel))  # a FIFO, device or huge file is an OSError

    def link(self, rel: str, target: str) -> None:
        self._clear(rel).symlink_to(target)

    def remove_empty_dir(self, rel: str) -> bool:
        try:
            (self.root / rel).rmdir()
        except OSError:
            return False
        return True

    def _clear(self, rel: str) -> Path:
        dst = self.root / rel
        if dst.is_dir() and not dst.is_symlink():
            dst.rmdir()  # a directory the agent replaced by a file; fails if still in use
        dst.parent.mkdir(parents=True, exist_ok=True)
        self.remove(rel)
        return dst
