"""Where the agent's changes land: a fresh runtime's workspace, written by relative path.

The other direction of :mod:`polar.runtimes.snapshot`. An evaluator grading on a clean copy
(``refresh_runtime``) replays the agent's diff onto a fresh runtime through
``Runtime.workspace_writer()``, never through a host path, so a runtime whose sandbox lives
elsewhere (a pod, a sandbox service) returns a writer that sends each change there.
:class:`HostWriter` writes a host directory (the local, bubblewrap, docker and apptainer
runtimes map the workspace there). The methods block: callers run them in a worker thread.
"""

from __future__ import annotations

import stat
from abc import ABC, abstractmethod
from pathlib import Path

from polar.runtimes.safe_files import (
    lstat_beneath,
    make_dirs,
    make_link,
    remove_beneath,
    remove_empty_dir_beneath,
)
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
    """A workspace the host sees as a directory. Every change is made beneath its root
    through :mod:`polar.runtimes.safe_files`: no file is written, no directory made or
    removed, through a link in any component (the fresh tree may hold links of its own)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def remove(self, rel: str) -> None:
        remove_beneath(self.root / rel, root=self.root)

    def write(self, rel: str, source: WorkspaceSnapshot) -> None:
        # a FIFO, device or huge file is an OSError
        source.copy_to(rel, self._clear(rel), dst_root=self.root)

    def link(self, rel: str, target: str) -> None:
        make_link(self._clear(rel), target, root=self.root)

    def remove_empty_dir(self, rel: str) -> bool:
        return remove_empty_dir_beneath(self.root / rel, root=self.root)

    def _clear(self, rel: str) -> Path:
        dst = self.root / rel
        try:
            is_dir = stat.S_ISDIR(lstat_beneath(dst, self.root).st_mode)
        except FileNotFoundError:
            is_dir = False
        if is_dir and not remove_empty_dir_beneath(dst, root=self.root):
            # a directory the agent replaced by a file; still in use
            raise IsADirectoryError(f"{dst} is a directory that is not empty")
        make_dirs(self.root, str(dst.parent.relative_to(self.root)))
        self.remove(rel)
        return dst
