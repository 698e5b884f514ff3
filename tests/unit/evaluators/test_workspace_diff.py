"""The agent's file-level diff, and replaying it onto a clean copy with protected paths."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from polar.evaluators.workspace_diff import apply_diff, diff_trees, matches
from polar.runtimes.snapshot import HostSnapshot
from polar.runtimes.workspace_writer import HostWriter

Tree = dict[str, tuple[bytes, bool]]  # rel path -> (content, executable)


def write(root: Path, tree: Tree) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for rel, (content, executable) in tree.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(0o755 if executable else 0o644)


def snapshot(root: Path) -> Tree:
    found: Tree = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            found[path.relative_to(root).as_posix()] = (
                path.read_bytes(),
                bool(path.stat().st_mode & 0o111),
            )
    return found


def valid_tree(paths: dict[str, tuple[bytes, bool]]) -> Tree:
    """Drop paths that are also a directory of another path (a file cannot be both)."""
    dirs = {str(Path(p).parent) for p in paths} | {
        str(parent) for p in paths for parent in Path(p).parents
    }
    return {p: v for p, v in paths.items() if p not in dirs}


rel_path = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3).map("/".join)
tree = st.dictionaries(
    rel_path, st.tuples(st.sampled_from([b"", b"x", b"y", b"x" * 3000]), st.booleans()), max_size=8
).map(valid_tree)


@settings(max_examples=60, deadline=None)
@given(base=tree, agent=tree, protected=st.sampled_from([[], ["a"], ["*c"], ["b/a", "c/c"]]))
def test_replaying_the_diff_reproduces_the_agent_except_protected_paths(base, agent, protected):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write(root / "base", base)
        write(root / "agent", agent)
        shutil.copytree(root / "base", root / "fresh", dirs_exist_ok=True)
        diff = diff_trees(HostSnapshot(root / "agent"), HostSnapshot(root / "base"))
        report = apply_diff(
            diff, HostSnapshot(root / "agent"), HostWriter(root / "fresh"), protected
        )
        result = snapshot(root / "fresh")
    if not protected:
        assert result == agent and not report.conflicts
        assert set(diff.changed) == {p for p in agent if base.get(p) != agent[p]}
        assert set(diff.deleted) == set(base) - set(agent)
        return
    for rel in set(base) | set(agent):
        if matches(rel, protected):
            assert result.get(rel) == base.get(rel)  # untouched by the agent's edits
        elif rel not in report.conflicts:
            assert result.get(rel) == agent.get(rel)
    assert set(report.protected) == {
        p for p in diff.changed + diff.deleted if matches(p, protected)
    }


def test_symlinks_ignored_dirs_and_emptied_directories(tmp_path: Path):
    base, agent, fresh = tmp_path / "base", tmp_path / "agent", tmp_path / "fresh"
    write(base, {"gone/only.txt": (b"1", False), "keep.txt": (b"k", False)})
    write(agent, {"keep.txt": (b"k", False), ".git/index": (b"i", False)})
    write(agent, {"pkg/__pycache__/m.pyc": (b"c", False)})
    (agent / "link").symlink_to("keep.txt")
    shutil.copytree(base, fresh)
    diff = diff_trees(HostSnapshot(agent), HostSnapshot(base))
    assert diff.changed == ["link"] and diff.deleted == ["gone/only.txt"]
    apply_diff(diff, HostSnapshot(agent), HostWriter(fresh))
    assert os.readlink(fresh / "link") == "keep.txt"
    assert not (fresh / "gone").exists()  # the emptied directory went too
    assert not (fresh / ".git").exists()


def test_patterns_cover_directories_and_cross_slashes():
    assert matches("tests/unit/test_x.py", ["tests"])
    assert matches("src/pkg/conftest.py", ["*conftest.py"])
    assert matches("tests/a.py", ["tests/*.py"])
    assert not matches("src/tests_helper.py", ["tests"])
    assert not matches("src/x.py", [])
