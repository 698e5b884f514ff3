"""The agent's changes as git-style unified diff text, for the record (an SFT row, a report).

:mod:`polar.evaluators.workspace_diff` finds *which* files changed and copies them; this module
writes *how* they changed, the way ``git diff`` prints it: ``diff --git a/p b/p`` headers,
``new file mode`` / ``deleted file mode`` / ``old mode``+``new mode`` lines, ``---``/``+++``
and hunks, ``\\ No newline at end of file``, a symbolic link as its target text (mode 120000),
and ``Binary files a/p and b/p differ`` for a binary file. The text applies with ``git apply``
to the tree it was taken against. It is made on the host from the two trees' snapshots, so the
runtime needs no git, and no link is ever followed: the agent owns its workspace.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from polar.evaluators.workspace_diff import WorkspaceDiff
from polar.runtimes.snapshot import WorkspaceSnapshot

_LARGEST_TEXT = 1024 * 1024
"""A file larger than this is not diffed line by line (difflib is slow on huge inputs)."""


@dataclass(frozen=True)
class _Side:
    mode: str
    content: bytes | None
    """None when the file is not shown line by line (binary, too large, unreadable): git's
    ``Binary files ... differ`` line stands for it."""


def _side(tree: WorkspaceSnapshot, rel: str) -> _Side | None:
    """What one tree holds at a path, or None when nothing is there."""
    entry = tree.entry(rel)
    if entry is None:
        return None
    if entry.kind == "link":
        return _Side("120000", entry.target.encode())
    mode = "100755" if entry.executable else "100644"
    try:
        data = tree.read(rel, _LARGEST_TEXT)  # never a FIFO, device or link's target
    except OSError:
        return _Side(mode, None)
    return _Side(mode, data if _is_text(data) else None)


def _is_text(data: bytes) -> bool:
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _hunks(rel: str, old: _Side | None, new: _Side | None) -> str:
    before = old.content.decode() if old is not None and old.content is not None else ""
    after = new.content.decode() if new is not None and new.content is not None else ""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=f"a/{rel}" if old is not None else "/dev/null",
        tofile=f"b/{rel}" if new is not None else "/dev/null",
        lineterm="\n",
    )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


def _file_patch(rel: str, old: _Side | None, new: _Side | None) -> str:
    """The ``git diff`` text for one path; empty when both sides are the same."""
    if old is not None and new is not None and (old.mode == "120000") != (new.mode == "120000"):
        # git shows a file turned into a link (or back) as a deletion and a creation
        return _file_patch(rel, old, None) + _file_patch(rel, None, new)
    head = f"diff --git a/{rel} b/{rel}\n"
    if old is None and new is not None:
        head += f"new file mode {new.mode}\n"
    elif new is None and old is not None:
        head += f"deleted file mode {old.mode}\n"
    elif old is not None and new is not None and old.mode != new.mode:
        head += f"old mode {old.mode}\nnew mode {new.mode}\n"
    same = old is not None and new is not None and old.content == new.content
    if same and old is not None and old.content is not None:  # a mode change only
        return head if new is not None and old.mode != new.mode else ""
    if (old is not None and old.content is None) or (new is not None and new.content is None):
        a = f"a/{rel}" if old is not None else "/dev/null"
        b = f"b/{rel}" if new is not None else "/dev/null"
        return head + f"Binary files {a} and {b} differ\n"
    return head + _hunks(rel, old, new)


def unified_patch(
    diff: WorkspaceDiff, new_root: WorkspaceSnapshot, old_root: WorkspaceSnapshot, limit: int
) -> tuple[str, bool]:
    """``diff`` as unified diff text from ``old_root`` to ``new_root``, at most ``limit``
    characters (whole files only); and whether files were left out to stay under it."""
    parts: list[str] = []
    size = 0
    for rel in sorted({*diff.changed, *diff.deleted}):
        new = _side(new_root, rel) if rel in diff.changed else None
        text = _file_patch(rel, _side(old_root, rel), new)
        if size + len(text) > limit:
            return "".join(parts), True
        parts.append(text)
        size += len(text)
    return "".join(parts), False
