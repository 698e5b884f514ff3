"""Host-side access to what a sandbox wrote: never block, never follow a link, never run away.

The harness owns its workspace and its home, and the node reads them with its own rights on the
host (evaluators diff and copy the agent's tree, transfers move files out, graders read logs).
A plain ``open()`` there is a trap: a FIFO blocks it forever (one ``mkfifo`` wedged a node's
post-run workers for good), a device node reads without end, a link leads to host files, a
sparse file claims a terabyte, and a million files make a walk that never ends. Everything the
host reads from a sandbox's tree goes through this module instead.

**The path rule.** A path is resolved *beneath a root*: the caller names the tree's top
(``root``, a host directory Polar chose, trusted as it stands), and every component below it is
opened relative to the directory already open above it, with ``O_NOFOLLOW``. A link in any
component (``sub -> /etc`` planted as a directory, or a directory swapped for a link between a
walk and a read) is refused (:class:`UnsafeFile`), and so is a ``..`` component. With no root,
the path is resolved from ``/`` (or the working directory, for a relative path) under the same
rule: no component at all may be a link. Because each step opens from a descriptor already held,
a link swapped in after a check is still never followed (the rule ``openat2`` spells
``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``, done per component so it holds on every kernel).

Beneath the root:

- a file is opened ``O_RDONLY | O_NONBLOCK | O_NOFOLLOW``, ``fstat``-ed, and read only if it is
  a regular file no larger than the caller's cap (:class:`UnsafeFile` otherwise);
- a file is written ``O_NOFOLLOW | O_NONBLOCK`` and only over a regular file or nothing, and a
  directory is made only where no link stands (:func:`make_dirs`);
- a walk lists entries without following links, descends through directory descriptors (a
  directory swapped for a link while it is walked is not entered), and stops at
  :data:`MAX_ENTRIES` entries or :data:`MAX_DEPTH` levels (:class:`TreeTooLarge`).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from polar.errors import TreeTooLarge, UnsafeFile

READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_STEP_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""A directory on the way down: looked through, never listed, never a link."""
_LIST_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
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


# -- resolving a path beneath its root ---------------------------------------------------------


def _parts(path: Path, root: Path | None) -> tuple[Path, tuple[str, ...]]:
    """The trusted anchor and the components below it that must each be a real directory
    (all but the last) or entry (the last)."""
    if root is None:
        anchor = Path(path.anchor or ".")
        parts = path.parts[1:] if path.anchor else path.parts
    else:
        try:
            parts = path.relative_to(root).parts
        except ValueError:
            raise UnsafeFile(f"{path} is not beneath {root}; it is not read or written") from None
        anchor = root
    if ".." in parts:
        raise UnsafeFile(f"{path} climbs with '..'; paths are resolved beneath {anchor} only")
    return anchor, parts


def _refuse_link(fd: int, name: str, path: Path, exc: OSError) -> None:
    """Turn the ELOOP or ENOTDIR of opening ``name`` with O_NOFOLLOW into :class:`UnsafeFile`
    when a link stands there (anything else is re-raised as it was)."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        try:
            is_link = stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
        except OSError:
            is_link = False
        if is_link:
            raise UnsafeFile(
                f"{path}: {name!r} is a symbolic link; no path is followed through one"
            ) from exc


def _descend(fd: int, parts: tuple[str, ...], path: Path) -> int:
    """The directory ``parts`` below the open directory ``fd``, each component opened from
    the one above without following a link; ``fd`` is consumed (closed or returned)."""
    try:
        for part in parts:
            below = _open_at(fd, part, _STEP_FLAGS, path)
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def _parent(path: Path, root: Path | None) -> Iterator[tuple[int, str]]:
    """The open directory that holds ``path``'s last component, beneath ``root``, and that
    component's name ('.' when ``path`` is the anchor itself)."""
    anchor, parts = _parts(Path(path), root)
    fd = _descend(os.open(anchor, _STEP_FLAGS & ~os.O_NOFOLLOW), parts[:-1], Path(path))
    try:
        yield fd, parts[-1] if parts else "."
    finally:
        os.close(fd)


def _open_at(fd: int, name: str, flags: int, path: Path, mode: int = 0o600) -> int:
    try:
        return os.open(name, flags, mode, dir_fd=fd)
    except OSError as exc:
        _refuse_link(fd, name, path, exc)
        raise


def lstat_beneath(path: Path, root: Path | None = None) -> os.stat_result:
    """What is at ``path`` (a link itself, not its target), reached beneath ``root``;
    :class:`UnsafeFile` when a component above it is a link."""
    with _parent(path, root) as (fd, name):
        return os.stat(name, dir_fd=fd, follow_symlinks=False)


def entry_beneath(path: Path, root: Path | None = None) -> TreeEntry:
    """What is at ``path`` as a walk lists it (a link with its target, never followed),
    reached beneath ``root`` in one descent."""
    with _parent(path, root) as (fd, name):
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        return TreeEntry(mode, os.readlink(name, dir_fd=fd) if stat.S_ISLNK(mode) else "")


def readlink_beneath(path: Path, root: Path | None = None) -> str:
    """The target of the link at ``path``, reached beneath ``root``."""
    with _parent(path, root) as (fd, name):
        return os.readlink(name, dir_fd=fd)


# -- reading, comparing, copying and writing regular files ----------------------------------------


@contextmanager
def open_regular(
    path: Path, limit: int = MAX_FILE_BYTES, *, root: Path | None = None
) -> Iterator[tuple[BinaryIO, int]]:
    """``path`` open for reading with its size, if it is a regular file of at most ``limit``
    bytes reached beneath ``root`` (see the module's path rule); :class:`UnsafeFile` if not,
    :class:`OSError` if it cannot be opened."""
    with _parent(path, root) as (parent, name):
        fd = _open_at(parent, name, READ_FLAGS, Path(path))
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


def read_regular(path: Path, limit: int = MAX_FILE_BYTES, *, root: Path | None = None) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``; see :func:`open_regular`)."""
    with open_regular(path, limit, root=root) as (handle, _):
        data = handle.read(limit + 1)
    if len(data) > limit:  # it grew after fstat
        raise UnsafeFile(f"{path} holds more than {limit} bytes")
    return data


def same_content(
    a: Path,
    b: Path,
    limit: int = MAX_FILE_BYTES,
    *,
    root_a: Path | None = None,
    root_b: Path | None = None,
) -> bool:
    """Whether two regular files hold the same bytes (false for anything else)."""
    try:
        with (
            open_regular(a, limit, root=root_a) as (left, size_a),
            open_regular(b, limit, root=root_b) as (right, size_b),
        ):
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


def copy_regular(
    src: Path,
    dst: Path,
    limit: int = MAX_FILE_BYTES,
    *,
    src_root: Path | None = None,
    dst_root: Path | None = None,
) -> None:
    """Copy the regular file ``src`` over ``dst`` (a regular file or nothing, never a link),
    with its permission bits and times, each reached beneath its root; :class:`UnsafeFile` or
    :class:`OSError` if either side is not what it should be."""
    with open_regular(src, limit, root=src_root) as (source, _):
        info = os.fstat(source.fileno())
        with _open_target(dst, dst_root) as target:
            copied = 0
            while chunk := source.read(_CHUNK):
                copied += len(chunk)
                if copied > limit:
                    raise UnsafeFile(f"{src} holds more than {limit} bytes")
                target.write(chunk)
            target.flush()
            os.fchmod(target.fileno(), stat.S_IMODE(info.st_mode) & 0o777)
            os.utime(target.fileno(), ns=(info.st_atime_ns, info.st_mtime_ns))


def write_regular(dst: Path, data: bytes, mode: int = 0o644, *, root: Path | None = None) -> None:
    """Write ``data`` over ``dst`` (a regular file or nothing, never a link, reached beneath
    ``root``) with ``mode``."""
    with _open_target(dst, root) as target:
        target.write(data)
        os.fchmod(target.fileno(), mode & 0o777)


@contextmanager
def _open_target(dst: Path, root: Path | None) -> Iterator[BinaryIO]:
    with _parent(dst, root) as (parent, name):
        fd = _open_at(parent, name, WRITE_FLAGS, Path(dst))
    with os.fdopen(fd, "wb") as target:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            raise UnsafeFile(f"{dst} is {_kind(kind)}; only regular files are written")
        yield target


# -- directories, links and removal beneath a root -----------------------------------------------


def make_dirs(root: Path, rel: str) -> Path:
    """``root/rel`` made a directory, each level created or found a real directory: never
    one made through a link the sandbox planted (:class:`UnsafeFile`)."""
    path = Path(root) / rel
    _, parts = _parts(path, Path(root))
    fd = os.open(root, _STEP_FLAGS & ~os.O_NOFOLLOW)
    try:
        for part in parts:
            with suppress(FileExistsError):
                os.mkdir(part, dir_fd=fd)
            below = _open_at(fd, part, _STEP_FLAGS, path)
            os.close(fd)
            fd = below
    finally:
        os.close(fd)
    return path


def make_link(path: Path, target: str, *, root: Path | None = None) -> None:
    """A symbolic link to ``target`` at ``path`` (where nothing stands), made beneath
    ``root``; the link is made, never followed."""
    with _parent(path, root) as (fd, name):
        os.symlink(target, name, dir_fd=fd)


def remove_beneath(path: Path, *, root: Path | None = None) -> None:
    """Delete the file, link or directory tree at ``path`` beneath ``root`` (nothing there is
    no error); a tree is removed through descriptors, so no link inside it is followed."""
    try:
        with _parent(path, root) as (fd, name):
            try:
                mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                return
            if stat.S_ISDIR(mode):
                shutil.rmtree(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)
    except (FileNotFoundError, NotADirectoryError):  # no parent, or a file in its place
        return


def remove_empty_dir_beneath(path: Path, *, root: Path | None = None) -> bool:
    """Remove the directory at ``path`` beneath ``root`` if it is empty; whether it was."""
    try:
        with _parent(path, root) as (fd, name):
            os.rmdir(name, dir_fd=fd)
    except OSError:
        return False
    return True


# -- walking and copying trees ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TreeEntry:
    """One entry a walk found, as it stood when listed (never followed)."""

    mode: int
    target: str = ""
    """A link's target."""

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_link(self) -> bool:
        return stat.S_ISLNK(self.mode)


def walk(
    root: Path,
    skip: Callable[[str], bool] = lambda rel: False,
    *,
    max_entries: int | None = None,
    max_depth: int | None = None,
) -> Iterator[tuple[str, TreeEntry]]:
    """Every entry under ``root`` as (``/``-separated relative path, :class:`TreeEntry`),
    in no set order; links are listed, never followed, and ``skip``-ped
    paths are neither listed nor entered. Raises :class:`TreeTooLarge` past the bounds
    (default :data:`MAX_ENTRIES` and :data:`MAX_DEPTH`)."""
    top = os.open(root, _LIST_FLAGS & ~os.O_NOFOLLOW)
    for rel, entry, _, _ in _walk_fd(top, Path(root), skip, max_entries, max_depth):
        yield rel, entry


def _walk_fd(
    top: int,
    root: Path,
    skip: Callable[[str], bool],
    max_entries: int | None,
    max_depth: int | None,
) -> Iterator[tuple[str, TreeEntry, int, str]]:
    """:func:`walk` from the open directory ``top`` (consumed), also yielding the open
    directory that holds each entry and its name, valid until the next step. Each directory
    is opened from its parent's descriptor with O_NOFOLLOW: one swapped for a link after it
    was listed is not entered."""
    max_entries = MAX_ENTRIES if max_entries is None else max_entries
    max_depth = MAX_DEPTH if max_depth is None else max_depth
    seen = 0
    stack: list[tuple[int, str, Iterator[os.DirEntry[str]]]] = []
    try:
        stack.append((top, "", iter(os.scandir(top))))
    except BaseException:
        os.close(top)
        raise
    try:
        while stack:
            fd, prefix, entries = stack[-1]
            found = next(entries, None)
            if found is None:
                stack.pop()
                os.close(fd)
                continue
            rel = prefix + found.name
            if skip(rel):
                continue
            seen += 1
            if seen > max_entries:
                raise TreeTooLarge(f"{root} holds more than {max_entries} entries")
            try:
                mode = found.stat(follow_symlinks=False).st_mode
                target = os.readlink(found.name, dir_fd=fd) if stat.S_ISLNK(mode) else ""
            except FileNotFoundError:  # gone since it was listed
                continue
            yield rel, TreeEntry(mode, target), fd, found.name
            if not stat.S_ISDIR(mode):
                continue
            if len(stack) >= max_depth:
                raise TreeTooLarge(f"{root} is deeper than {max_depth} levels at {rel}")
            try:
                below = os.open(found.name, _LIST_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                    continue  # swapped for a link or a file, or removed, since it was listed
                raise
            try:
                stack.append((below, rel + "/", iter(os.scandir(below))))
            except BaseException:
                os.close(below)
                raise
    finally:
        for fd, _, entries in stack:
            close = getattr(entries, "close", None)
            if close is not None:
                close()
            os.close(fd)


def copy_tree(
    src: Path, dst: Path, *, src_root: Path | None = None, dst_root: Path | None = None
) -> None:
    """Copy a file, link or directory between a sandbox's tree and the host, each side reached
    beneath its root: one side is a tree the harness owned, so no FIFO, device or oversized
    file is read, no link is followed (links are copied as links) and no directory is read
    or written through a link."""
    src, dst = Path(src), Path(dst)
    try:
        mode = lstat_beneath(src, src_root).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{src} does not exist") from None
    if dst_root is None or dst != Path(dst_root):
        _make_dir(dst.parent, dst_root)
    if not stat.S_ISDIR(mode):
        _copy_entry(mode, src, dst, src_root, dst_root)
        return
    _make_dir(dst, dst_root)
    with _parent(src, src_root) as (fd, name):
        top = _open_at(fd, name, _LIST_FLAGS, src)
    for rel, entry, _, _ in _walk_fd(top, src, lambda rel: False, None, None):
        if entry.is_dir:
            _make_dir(dst / rel, dst_root)
        else:  # reached again beneath the root: a directory swapped since is refused
            _copy_entry(entry.mode, src / rel, dst / rel, src_root, dst_root)


def _make_dir(path: Path, root: Path | None) -> None:
    """``path`` a real directory (made with its parents if missing), never one reached
    through a link."""
    anchor, parts = _parts(path, root)
    make_dirs(anchor, "/".join(parts))


def _copy_entry(
    mode: int, src: Path, dst: Path, src_root: Path | None, dst_root: Path | None
) -> None:
    if not stat.S_ISLNK(mode):
        copy_regular(src, dst, src_root=src_root, dst_root=dst_root)
        return
    target = readlink_beneath(src, src_root)
    with _parent(dst, dst_root) as (fd, name):
        try:
            existing: int | None = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            existing = None
        if existing is not None and not stat.S_ISDIR(existing):
            os.unlink(name, dir_fd=fd)
        os.symlink(target, name, dir_fd=fd)


def hand_over_tree(top: Path, owner: tuple[int, int] | None, *, root: Path | None = None) -> None:
    """``top`` and everything beneath it (reached beneath ``root``) given to ``owner`` (uid,
    gid), or, with no owner, made writable by everyone: entry by entry through descriptors,
    so no link, even one swapped in meanwhile, hands over a host file."""
    try:
        mode = lstat_beneath(top, root).st_mode
    except FileNotFoundError:
        return
    with _parent(top, root) as (fd, name):
        _hand_over(fd, name, owner)
        if not stat.S_ISDIR(mode):
            return
        tree = _open_at(fd, name, _LIST_FLAGS, top)
    for _, _, parent, entry in _walk_fd(tree, top, lambda rel: False, None, None):
        _hand_over(parent, entry, owner)


def _hand_over(fd: int, name: str, owner: tuple[int, int] | None) -> None:
    if owner is not None:
        os.chown(name, *owner, dir_fd=fd, follow_symlinks=False)
        return
    try:  # opened, never followed, so the mode lands on what was checked
        entry = os.open(name, READ_FLAGS, dir_fd=fd)
    except OSError:
        return  # a link (ELOOP), or gone: nothing to open up
    try:
        mode = os.fstat(entry).st_mode
        if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
            extra = 0o777 if stat.S_ISDIR(mode) or mode & 0o111 else 0o666
            os.fchmod(entry, stat.S_IMODE(mode) | extra)
    finally:
        os.close(entry)
