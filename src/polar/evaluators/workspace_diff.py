"""The agent's changes to a workspace, as files, and applying them to a clean copy.

A fresh runtime started from the task's spec has the same workspace the agent started from (the
spec's files plus whatever the prepare steps made), so the agent's changes are the difference
between the two trees: files added or modified (content, symlink target or executable bit) and
files deleted. Applying them to the fresh tree, except on ``protected`` paths, grades the
agent's work against tests it could not edit. No git is needed in the workspace. Both trees
are read as :class:`~polar.runtimes.snapshot.WorkspaceSnapshot` (wherever the runtime keeps
them), and the changes land in the clean copy through its
:class:`~polar.runtimes.workspace_writer.WorkspaceWriter`: no host path on either side.

Patterns are fnmatch-style on ``/``-separated relative paths (``*`` also crosses ``/``), and a
pattern that matches a directory covers everything under it: ``tests`` protects ``tests/**``,
``*conftest.py`` every conftest.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from polar.runtimes.snapshot import SnapshotEntry, WorkspaceSnapshot
from polar.runtimes.workspace_writer import WorkspaceWriter

DEFAULT_IGNORE = (".git", "*__pycache__")


def matches(rel: str, patterns: list[str] | tuple[str, ...]) -> bool:
    """Whether ``rel`` or one of its parent directories matches any pattern."""
    path = PurePosixPath(rel)
    candidates = [str(path), *(str(parent) for parent in path.parents if str(parent) != ".")]
    return any(fnmatch.fnmatchcase(c, pattern) for c in candidates for pattern in patterns)


def _entries(
    tree: WorkspaceSnapshot, ignore: list[str] | tuple[str, ...]
) -> dict[str, SnapshotEntry]:
    """Every non-directory entry of ``tree`` by relative path (a link to a directory counts as
    a link), through its bounded, link-free walk: the agent's tree may hold millions of files."""
    return {
        rel: entry
        for rel, entry in tree.walk(lambda rel: matches(rel, ignore))
        if entry.kind != "dir"
    }


def _same(
    rel: str, agent: WorkspaceSnapshot, a: SnapshotEntry, base: WorkspaceSnapshot, b: SnapshotEntry
) -> bool:
    """Same link target, or regular files with the same bytes and executable bit; anything
    else a sandbox can make (a FIFO, a device) counts as changed and is never opened."""
    if a.kind == "link" or b.kind == "link":
        return a.kind == b.kind and a.target == b.target
    if not (a.kind == "file" and b.kind == "file"):
        return False
    return a.executable == b.executable and agent.same_file(rel, base)


@dataclass(frozen=True)
class WorkspaceDiff:
    changed: list[str] = field(default_factory=list)
    """Added or modified, relative to the base tree."""
    deleted: list[str] = field(default_factory=list)


def diff_trees(
    agent: WorkspaceSnapshot,
    base: WorkspaceSnapshot,
    ignore: list[str] | tuple[str, ...] = DEFAULT_IGNORE,
) -> WorkspaceDiff:
    """What turns ``base`` into ``agent``, file by file."""
    mine, theirs = _entries(agent, ignore), _entries(base, ignore)
    changed = sorted(
        rel
        for rel, entry in mine.items()
        if rel not in theirs or not _same(rel, agent, entry, base, theirs[rel])
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


def _prune_empty_parents(target: WorkspaceWriter, agent: WorkspaceSnapshot, rel: str) -> None:
    """Drop directories a deletion emptied, unless the agent's tree still has them."""
    for parent in PurePosixPath(rel).parents:
        entry = agent.entry(str(parent)) if str(parent) != "." else None
        if str(parent) == "." or (entry is not None and entry.kind == "dir"):
            return
        if not target.remove_empty_dir(str(parent)):
            return


def apply_diff(
    diff: WorkspaceDiff,
    agent: WorkspaceSnapshot,
    target: WorkspaceWriter,
    protected: list[str] | tuple[str, ...] = (),
) -> ApplyReport:
    """Replay ``diff`` from ``agent`` onto ``target`` (a fresh runtime's
    ``workspace_writer()``), leaving ``protected`` paths untouched."""
    report = ApplyReport()
    for rel in diff.deleted:
        if matches(rel, protected):
            report.protected.append(rel)
            continue
        try:
            target.remove(rel)
            _prune_empty_parents(target, agent, rel)
        except OSError:  # e.g. a link in the clean copy where a parent directory would be
            report.conflicts.append(rel)
            continue
        report.applied.append(rel)
    for rel in diff.changed:
        if matches(rel, protected):
            report.protected.append(rel)
            continue
        try:
            entry = agent.entry(rel)
            if entry is not None and entry.kind == "link":
                target.link(rel, entry.target)
            else:
                target.write(rel, agent)  # a FIFO, device or huge file is a conflict
        except OSError:
            report.conflicts.append(rel)
            continue
        report.applied.append(rel)
    return report
