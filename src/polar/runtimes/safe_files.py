"""Host-side access to what a sandbox wrote: never block, never follow a link, never run away.

The harness owns its workspace and its home, and the node reads them with its own rights on the
host (evaluators diff and copy the agent's tree, transfers move files out, graders read logs).
A plain ``open()`` there is a trap: a FIFO blocks it forever (one ``mkfifo`` wedged a node's
post-run workers for good), a device node reads without end, a link leads to host files, a
sparse file claims a terabyte, and a million files make a walk that never ends. Everything the
host reads from a sandbox's tree goes through this module instead:

- a file is opened ``O_RDONLY | O_NONBLOCK | O_NOFOLLOW``, ``fstat``-ed, and read only if it is
  a regular file no larger than the caller's cap (:class:`UnsafeFile` otherwise);
- a file is written ``O_NOFOLLOW | O_NONBLOCK`` and only over a regular file or nothing, and a
  directory is made only where no link stands (:func:`make_dirs`);
- a walk lists entries without following links, and stops at :data:`MAX_ENTRIES` entries or
  :data:`MAX_DEPTH` levels (:class:`TreeTooLarge`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from polar.errors import TreeTooLarge, UnsafeFile

READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_FILE_BYTES = 128 * 1024 * 1024
"""The largest file copied out of (or between) sandbox trees."""
MAX_ENTRIES = 200_000
"""Entries one walk of a sandbox's tree visits before it gives up."""
MAX_DEPTH = 64
"""Directory levels one walk descends."""
_CHUNK = 1024 * 1024


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


@contextmanager
def open_regular(path: Path, limit: int = MAX_FILE_BYTES) -> Iterator[tuple[BinaryIO, int]]:
    """``path`` open for reading with its size, if it is a regular file of at most ``limit``
    bytes; :class:`UnsafeFile` if not, :class:`OSError` if it cannot be opened (a link at
    ``path`` itself fails with ELOOP)."""
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafeFile(f"{path} is a symbolic link; it is not followed") from exc
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFile(f"{path} is {_kind(info.st_mode)}; only regular files are read")
        if info.st_size > limit:
            raise UnsafeFile(f"{path} holds {info.st_size} bytes, more than {limit}")
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle, info.st_size


def read_regular(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``; see :func:`open_regular`)."""
    with open_regular(path, limit) as (handle, _):
        data = handle.read(limit + 1)
    if len(data) > limit:  # it grew after fstat
        raise UnsafeFile(f"{path} holds more than {limit} bytes")
    return data


def same_content(a: Path, b: Path, limit: int = MAX_FILE_BYTES) -> bool:
    """Whether two regular files hold the same bytes (false for anything else)."""
    try:
        with open_regular(a, limit) as (left, size_a), open_regular(b, limit) as (right, size_b):
            if size_a != size_b:
                return False
            while True:
                x, y = left.read(_CHUNK), right.read(_CHUNK)
                if x != y:
                    return False
                if not x:
                    return True
    except OSError:
        return False


def copy_regular(src: Path, dst: Path, limit: int = MAX_FILE_BYTES) -> None:
    """Copy the regular file ``src`` over ``dst`` (a regular file or nothing, never a link),
    with its permission bits and times; :class:`UnsafeFile` or :class:`OSError` if either side
    is not what it should be."""
    with open_regular(src, limit) as (source, _):
        info = os.fstat(source.fileno())
        with _open_target(dst) as target:
            copied = 0
            while chunk := source.read(_CHUNK):
                copied += len(chunk)
                if copied > limit:
                    raise UnsafeFile(f"{src} holds more than {limit} bytes")
                target.write(chunk)
            os.fchmod(target.fileno(), stat.S_IMODE(info.st_mode) & 0o777)
        os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)


def write_regular(dst: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` over ``dst`` (a regular file or nothing, never a link) with ``mode``."""
    with _open_target(dst) as target:
        target.write(data)
        os.fchmod(target.fileno(), mode & 0o777)


@contextmanager
def _open_target(dst: Path) -> Iterator[BinaryIO]:
    try:
        fd = os.open(dst, WRITE_FLAGS, 0o600)
    except OSError as exc:
        if os.path.islink(dst):
            raise UnsafeFile(f"{dst} is a symbolic link; it is not written through") from exc
        raise
    with os.fdopen(fd, "wb") as target:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            raise UnsafeFile(f"{dst} is {_kind(kind)}; only regular files are written")
        yield target


def make_dirs(root: Path, rel: str) -> Path:
    """``root/rel`` made a directory, each level created or found a real directory: never
    one made through a link the sandbox planted (:class:`UnsafeFile`)."""
    path = root
    for part in Path(rel).parts:
        path = path / part
        if path.is_symlink():
            raise UnsafeFile(f"{path} is a symbolic link; no directory is made through it")
        path.mkdir(exist_ok=True)
    return path


def walk(
    root: Path,
    skip: Callable[[str], bool] = lambda rel: False,
    *,
    max_entries: int | None = None,
    max_depth: int | None = None,
) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Every entry under ``root`` as (``/``-separated relative path, its ``DirEntry``),
    in no set order; links are listed, never followed, and ``skip``-ped
    paths are neither listed nor entered. Raises :class:`TreeTooLarge` past the bounds
    (default :data:`MAX_ENTRIES` and :data:`MAX_DEPTH`)."""
    max_entries = MAX_ENTRIES if max_entries is None else max_entries
    max_depth = MAX_DEPTH if max_depth is None else max_depth
    seen = 0
    pending: list[tuple[Path, str, int]] = [(root, "", 0)]
    while pending:
        directory, prefix, depth = pending.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                rel = prefix + entry.name
                if skip(rel):
                    continue
                seen += 1
                if seen > max_entries:
                    raise TreeTooLarge(f"{root} holds more than {max_entries} entries")
                yield rel, entry
                if entry.is_dir(follow_symlinks=False):
                    if depth + 1 >= max_depth:
                        raise TreeTooLarge(f"{root} is deeper than {max_depth} levels at {rel}")
                    pending.append((Path(entry.path), rel + "/", depth + 1))


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a file, link or directory between a sandbox's tree and the host: one side is a
    tree the harness owned, so no FIFO, device or oversized file is read, no link is followed
    (links are copied as links) and no directory is written through a link."""
    if not src.exists() and not src.is_symlink():
        raise FileNotFoundError(f"{src} does not exist")
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not src.is_dir() or src.is_symlink():
        _copy_entry(src, dst)
        return
    _make_dir(dst)
    for rel, entry in walk(src):
        target = dst / rel
        if entry.is_dir(follow_symlinks=False):
            _make_dir(target)
        else:
            _copy_entry(Path(entry.path), target)


def _make_dir(path: Path) -> None:
    if path.is_symlink():
        raise UnsafeFile(f"{path} is a symbolic link; nothing is copied through it")
    path.mkdir(exist_ok=True)


def _copy_entry(src: Path, dst: Path) -> None:
    if not src.is_symlink():
        copy_regular(src, dst)
        return
    if dst.is_symlink() or dst.is_file():
        dst.unlink()
    dst.symlink_to(os.readlink(src))
