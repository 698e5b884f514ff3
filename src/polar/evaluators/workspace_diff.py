"""The agent's changes to a workspace, as files, and applying them to a clean copy.

A fresh runtime started from the task's spec has the same workspace the agent started from (the
spec's files plus whatever the prepare steps made), so the agent's changes are the difference
between the two trees: files added or modified (content, symlink target or executable bit) and
files deleted. Applying them to the fresh tree, except on ``protected`` paths, grades the
agent's work against tests it could not edit. No git is needed in the workspace.

Patterns are fnmatch-style on ``/``-separated relative paths (``*`` also crosses ``/``), and a
pattern that matches a directory covers everything under it: ``tests`` protects ``tests/**``,
``*conftest.py`` every conftest.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from polar.runtimes.safe_files import copy_regular, same_content, walk

DEFAULT_IGNORE = (".git", "*__pycache__")


def matches(rel: str, patterns: list[str] | tuple[str, ...]) -> bool:
    """Whether ``rel`` or one of its parent directories matches any pattern."""
    path = PurePosixPath(rel)
    candidates = [str(path), *(str(parent) for parent in path.parents if str(parent) != ".")]
    return any(fnmatch.fnmatchcase(c, pattern) for c in candidates for pattern in patterns)


def _entries(root: Path, ignore: list[str] | tuple[str, ...]) -> dict[str, Path]:
    """Relative path -> absolute path of every non-directory entry under ``root`` (a link to a
    directory counts as a link), through the bounded, link-free walk of
    :func:`polar.runtimes.safe_files.walk`: the agent's tree may hold millions of files."""
    return {
        rel: Path(entry.path)
        for rel, entry in walk(root, lambda rel: matches(rel, ignore))
        if not entry.is_dir(follow_symlinks=False)
    }


def _same(a: Path, b: Path) -> bool:
    """Same link target, or regular files with the same bytes and executable bit; anything
    else a sandbox can make (a FIFO, a device) counts as changed and is never opened."""
    mode_a, mode_b = a.lstat().st_mode, b.lstat().st_mode
    if stat.S_ISLNK(mode_a) or stat.S_ISLNK(mode_b):
        return stat.S_ISLNK(mode_a) and stat.S_ISLNK(mode_b) and os.readlink(a) == os.readlink(b)
    if not (stat.S_ISREG(mode_a) and stat.S_ISREG(mode_b)):
        return False
    return (mode_a & 0o111) == (mode_b & 0o111) and same_content(a, b)


@dataclass(frozen=True)
class WorkspaceDiff:
    changed: list[str] = field(default_factory=list)
    """Added or modified, relative to the base tree."""
    deleted: list[str] = field(default_factory=list)


def diff_trees(
    agent: Path, base: Path, ignore: list[str] | tuple[str, ...] = DEFAULT_IGNORE
) -> WorkspaceDiff:
    """What turns ``base`` into ``agent``, file by file."""
    mine, theirs = _entries(agent, ignore), _entries(base, ignore)
    changed = sorted(
        rel for rel, path in mine.items() if rel not in theirs or not _same(path, theirs[rel])
    )
    deleted = sorted(rel for rel in theirs if rel not in mine)
    return WorkspaceDiff(changed=changed, deleted=deleted)


@dataclass(frozen=True)
class ApplyReport:
    applied: list[str] = field(default_factory=list)
    protected: list[str] = field(default_factory=list)
    """Changes refused because their path is protected."""
    conflicts: list[str] = field(default_factory=list)
    """Changes that could not be applied (a protected path in the way)."""


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _prune_empty_parents(target: Path, agent: Path, rel: str) -> None:
    """Drop directories a deletion emptied, unless the agent's tree still has them."""
    for parent in PurePosixPath(rel).parents:
        if str(parent) == "." or (agent / parent).is_dir():
            return
        try:
            (target / parent).rmdir()
        except OSError:
            return


def apply_diff(
    diff: WorkspaceDiff, agent: Path, target: Path, protected: list[str] | tuple[str, ...] = ()
) -> ApplyReport:
    """Replay ``diff`` from ``agent`` onto ``target``, leaving ``protected`` paths untouched."""
    report = ApplyReport()
    for rel in diff.deleted:
        if matches(rel, protected):
            report.protected.append(rel)
            continue
        _remove(target / rel)
        _prune_empty_parents(target, agent, rel)
        report.applied.append(rel)
    for rel in diff.changed:
        if matches(rel, protected):
            report.protected.append(rel)
            continue
        src, dst = agent / rel, target / rel
        try:
            if dst.is_dir() and not dst.is_symlink():
                dst.rmdir()  # a directory the agent replaced by a file; fails if still in use
            dst.parent.mkdir(parents=True, exist_ok=True)
            _remove(dst)
            if src.is_symlink():
                dst.symlink_to(os.readlink(src))
            else:
                copy_regular(src, dst)  # a FIFO, device or huge file is a conflict
        except OSError:
            report.conflicts.append(rel)
            continue
        report.applied.append(rel)
    return report
