"""The agent's workspace as the host reads it after a run: a snapshot, not a host path.

Evaluators list, compare, show and copy the agent's files only through
:class:`WorkspaceSnapshot` (``Runtime.workspace_snapshot``), so a runtime whose sandbox lives
elsewhere (a Kubernetes pod, a sandbox service) hands its workspace over the way it can:
:class:`HostSnapshot` reads a host directory through :mod:`polar.runtimes.safe_files` (the
local, bubblewrap, docker and apptainer runtimes map the workspace there); :class:`MemorySnapshot`
holds the files a remote runtime fetched (from an archive or its service's listing).
"""

from __future__ import annotations

import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from polar.runtimes.safe_files import (
    MAX_FILE_BYTES,
    UnsafeFile,
    copy_regular,
    entry_beneath,
    read_regular,
    same_content,
    walk,
    write_regular,
)

EntryKind = Literal["file", "link", "dir", "other"]


@dataclass(frozen=True)
class SnapshotEntry:
    """One path of the tree; ``other`` is anything a sandbox can make that is never read
    (a FIFO, a device, a socket)."""

    kind: EntryKind
    executable: bool = False
    target: str = ""
    """A link's target (links are listed, never followed)."""


def _never(rel: str) -> bool:
    return False


class WorkspaceSnapshot(ABC):
    """A read-only view of one workspace, by ``/``-separated relative path."""

    @abstractmethod
    def walk(self, skip: Callable[[str], bool] = _never) -> Iterator[tuple[str, SnapshotEntry]]:
        """Every entry, directories included, in no set order; ``skip``-ped paths are neither
        listed nor entered (bounded like :func:`polar.runtimes.safe_files.walk`)."""

    @abstractmethod
    def entry(self, rel: str) -> SnapshotEntry | None:
        """What is at ``rel``, or None when nothing is."""

    @abstractmethod
    def read(self, rel: str, limit: int = MAX_FILE_BYTES) -> bytes:
        """A regular file's bytes; :class:`UnsafeFile` for anything else or past ``limit``."""

    def copy_to(self, rel: str, dst: Path, *, dst_root: Path | None = None) -> None:
        """Write the regular file at ``rel`` over ``dst`` (a regular file or nothing, never a
        link, reached beneath ``dst_root``), with its executable bit."""
        entry = self.entry(rel)
        mode = 0o755 if entry is not None and entry.executable else 0o644
        write_regular(dst, self.read(rel), mode, root=dst_root)

    def same_file(self, rel: str, other: WorkspaceSnapshot) -> bool:
        """Whether both trees hold a regular file with the same bytes at ``rel``."""
        try:
            return self.read(rel) == other.read(rel)
        except OSError:
            return False


class HostSnapshot(WorkspaceSnapshot):
    """A workspace the host sees as a directory, read through ``safe_files`` beneath its root:
    no FIFO blocks it, no link is followed in any component of a path (``sub -> /etc`` makes
    ``sub/passwd`` no entry of the tree), no tree runs away."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def walk(self, skip: Callable[[str], bool] = _never) -> Iterator[tuple[str, SnapshotEntry]]:
        for rel, found in walk(self.root, skip):
            yield rel, _host_entry(found.mode, found.target)

    def entry(self, rel: str) -> SnapshotEntry | None:
        path = self.root / rel
        try:
            found = entry_beneath(path, self.root)
            return _host_entry(found.mode, found.target)
        except (FileNotFoundError, NotADirectoryError):  # a file stands where a parent would
            return None
        except UnsafeFile:  # a link stands where a parent would: the path is not in the tree
            return None

    def read(self, rel: str, limit: int = MAX_FILE_BYTES) -> bytes:
        return read_regular(self.root / rel, limit, root=self.root)

    def copy_to(self, rel: str, dst: Path, *, dst_root: Path | None = None) -> None:
        # streamed, with the permission bits and times
        copy_regular(self.root / rel, dst, src_root=self.root, dst_root=dst_root)

    def same_file(self, rel: str, other: WorkspaceSnapshot) -> bool:
        if isinstance(other, HostSnapshot):  # streamed, not held
            return same_content(
                self.root / rel, other.root / rel, root_a=self.root, root_b=other.root
            )
        return super().same_file(rel, other)


def _host_entry(mode: int, target: str) -> SnapshotEntry:
    if stat.S_ISLNK(mode):
        return SnapshotEntry("link", target=target)
    if stat.S_ISDIR(mode):
        return SnapshotEntry("dir")
    if stat.S_ISREG(mode):
        return SnapshotEntry("file", executable=bool(mode & 0o111))
    return SnapshotEntry("other")


class MemorySnapshot(WorkspaceSnapshot):
    """A workspace a remote runtime fetched: files by path (their directories implied),
    the executable ones, and links with their targets."""

    def __init__(
        self,
        files: Mapping[str, bytes],
        *,
        executable: Collection[str] = (),
        links: Mapping[str, str] | None = None,
    ) -> None:
        self.files = dict(files)
        self.links = dict(links or {})
        self._entries: dict[str, SnapshotEntry] = {}
        for rel in [*self.files, *self.links]:
            for parent in PurePosixPath(rel).parents:
                if str(parent) != ".":
                    self._entries[str(parent)] = SnapshotEntry("dir")
        for rel in self.files:
            self._entries[rel] = SnapshotEntry("file", executable=rel in executable)
        for rel, target in self.links.items():
            self._entries[rel] = SnapshotEntry("link", target=target)

    def walk(self, skip: Callable[[str], bool] = _never) -> Iterator[tuple[str, SnapshotEntry]]:
        for rel, entry in self._entries.items():
            skipped = [str(p) for p in PurePosixPath(rel).parents if str(p) != "."]
            if not skip(rel) and not any(skip(parent) for parent in skipped):
                yield rel, entry

    def entry(self, rel: str) -> SnapshotEntry | None:
        return self._entries.get(str(PurePosixPath(rel)))

    def read(self, rel: str, limit: int = MAX_FILE_BYTES) -> bytes:
        data = self.files.get(str(PurePosixPath(rel)))
        if data is None:
            raise UnsafeFile(f"{rel} is no regular file of the snapshot")
        if len(data) > limit:
            raise UnsafeFile(f"{rel} holds {len(data)} bytes, more than {limit}")
        return data
