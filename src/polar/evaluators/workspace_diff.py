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

import filecmp
import fnmatch
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

DEFAULT_IGNORE = (".git", "*__pycache__")


def matches(rel: str, patterns: list[str] | tuple[str, ...]) -> bool:
    """Whether ``rel`` or one of its parent directories matches any pattern."""
    path = PurePosixPath(rel)
    candidates = [str(path), *(str(parent) for parent in path.parents if str(parent) != ".")]
    return any(fnmatch.fnmatchcase(c, pattern) for c in candidates for pattern in patterns)


def _entries(root: Path, ignore: list[str] | tuple[str, ...]) -> dict[str, Path]:
    """Relative path -> absolute path of every file and symlink under ``root`` (not dirs)."""
    found: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        rel_dir = here.relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        kept = []
        for name in dirnames:
            rel = prefix + name
            if matches(rel, ignore):
                continue
            if (here / name).is_symlink():  # os.walk does not descend links: record the link
                found[rel] = here / name
            else:
                kept.append(name)
        dirnames[:] = kept
        for name in filenames:
            rel = prefix + name
            if not matches(rel, ignore):
                found[rel] = here / name
    return found


def _same(a: Path, b: Path) -> bool:
    if a.is_symlink() or b.is_symlink():
        return a.is_symlink() and b.is_symlink() and os.readlink(a) == os.readlink(b)
    exec_a = stat.S_IMODE(a.lstat().st_mode) & 0o111
    exec_b = stat.S_IMODE(b.lstat().st_mode) & 0o111
    return exec_a == exec_b and filecmp.cmp(a, b, shallow=False)


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
                shutil.copy2(src, dst)
        except OSError:
            report.conflicts.append(rel)
            continue
        report.applied.append(rel)
    return report
