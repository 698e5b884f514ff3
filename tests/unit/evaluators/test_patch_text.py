"""The agent's changes as git-style diff text: what git prints, and what git apply takes back."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from polar.evaluators.patch_text import unified_patch
from polar.evaluators.workspace_diff import WorkspaceDiff, diff_trees
from polar.runtimes.snapshot import HostSnapshot

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(cwd: Path, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, input=stdin, capture_output=True, text=True, check=True
    )
    return done.stdout


def trees(tmp_path: Path) -> tuple[Path, Path]:
    old, new = tmp_path / "old", tmp_path / "new"
    for root in (old, new):
        (root / "pkg").mkdir(parents=True)
        (root / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
        (root / "gone.txt").write_text("bye\n")
        (root / "tool.sh").write_text("echo hi\n")
        (root / "tail.txt").write_text("last line\n")
        (root / "was_file").write_text("plain\n")
    (new / "pkg" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (new / "gone.txt").unlink()
    (new / "tool.sh").chmod(0o755)
    (new / "tail.txt").write_text("last line, no newline")
    (new / "pkg" / "new.py").write_text("X = 1\n")
    (new / "link").symlink_to("pkg/calc.py")
    (new / "was_file").unlink()
    (new / "was_file").symlink_to("tail.txt")
    (new / "empty.txt").write_text("")
    return old, new


def _trees(new: Path, old: Path) -> tuple[WorkspaceDiff, HostSnapshot, HostSnapshot]:
    """The diff from ``old`` to ``new`` and both trees' snapshots, as unified_patch takes them."""
    after, before = HostSnapshot(new), HostSnapshot(old)
    return diff_trees(after, before), after, before


def test_the_patch_is_what_git_would_print_and_applies_back(tmp_path: Path):
    old, new = trees(tmp_path)
    patch, truncated = unified_patch(*_trees(new, old), limit=1 << 20)
    assert not truncated
    assert (
        "diff --git a/pkg/calc.py b/pkg/calc.py\n--- a/pkg/calc.py\n+++ b/pkg/calc.py\n"
        "@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
    ) in patch
    assert "diff --git a/gone.txt b/gone.txt\ndeleted file mode 100644\n" in patch
    assert "diff --git a/tool.sh b/tool.sh\nold mode 100644\nnew mode 100755\n" in patch
    assert "+last line, no newline\n\\ No newline at end of file\n" in patch
    assert "new file mode 120000\n" in patch and "+pkg/calc.py\n\\ No newline" in patch

    git(old, "init", "-q")
    git(old, "apply", "--verbose", "-", stdin=patch)
    assert diff_trees(HostSnapshot(new), HostSnapshot(old), ignore=(".git",)).changed == []
    assert diff_trees(HostSnapshot(new), HostSnapshot(old), ignore=(".git",)).deleted == []
    assert os.readlink(old / "was_file") == "tail.txt"
    assert os.access(old / "tool.sh", os.X_OK)


def test_binary_files_are_named_not_shown(tmp_path: Path):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    (old / "blob.bin").write_bytes(b"\x00\x01")
    (new / "blob.bin").write_bytes(b"\x00\x02")
    (new / "latin.txt").write_bytes(b"caf\xe9\n")
    patch, _ = unified_patch(*_trees(new, old), limit=1 << 20)
    assert patch == (
        "diff --git a/blob.bin b/blob.bin\nBinary files a/blob.bin and b/blob.bin differ\n"
        "diff --git a/latin.txt b/latin.txt\nnew file mode 100644\n"
        "Binary files /dev/null and b/latin.txt differ\n"
    )


def test_the_limit_keeps_whole_files_and_says_so(tmp_path: Path):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    for name in ("a.py", "b.py", "c.py"):
        (new / name).write_text("x = 1\n" * 50)
    full, _ = unified_patch(*_trees(new, old), limit=1 << 20)
    cut, truncated = unified_patch(*_trees(new, old), limit=len(full) - 1)
    assert truncated and full.startswith(cut) and cut.count("diff --git") == 2


def test_a_link_is_never_followed(tmp_path: Path):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("host data\n")
    (new / "peek").symlink_to(secret)
    patch, _ = unified_patch(*_trees(new, old), limit=1 << 20)
    assert "host data" not in patch and f"+{secret}\n" in patch
