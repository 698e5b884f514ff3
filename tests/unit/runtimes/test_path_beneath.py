"""No host-side reader leaves the workspace through any component of a path.

A harness owns its workspace, and the node reads it with the host's rights. ``O_NOFOLLOW`` on
the last component is not enough: a planted ``sub -> /host/dir`` (or a real ``sub`` swapped for
such a link after a walk listed it) turns ``sub/secret.txt`` into a host file. Every reader,
copier and writer here must refuse it, and none may hand the host file's bytes to an evaluator,
a diff, a patch, a transfer or a clean copy.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from polar.errors import UnsafeFile
from polar.evaluators.patch_text import unified_patch
from polar.evaluators.swe_tests import read_log
from polar.evaluators.workspace_diff import WorkspaceDiff, apply_diff, diff_trees
from polar.runtimes.registry import create_runtime
from polar.runtimes.safe_files import (
    copy_regular,
    copy_tree,
    hand_over_tree,
    lstat_beneath,
    open_regular,
    read_regular,
    same_content,
    walk,
    write_regular,
)
from polar.runtimes.snapshot import HostSnapshot
from polar.runtimes.workspace_writer import HostWriter
from polar.schemas.task import RuntimeSpec

SECRET = b"host secret\n"


@pytest.fixture
def host_dir(tmp_path: Path) -> Path:
    """A host directory the harness must never reach, with a secret in it."""
    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET)
    return outside


def _workspace(tmp_path: Path, name: str = "workspace") -> Path:
    root = tmp_path / name
    (root / "src").mkdir(parents=True)
    (root / "src" / "ok.py").write_text("x = 1\n")
    return root


def _plant(root: Path, host_dir: Path) -> None:
    (root / "sub").symlink_to(host_dir, target_is_directory=True)


def _swap_for_link(directory: Path, host_dir: Path) -> None:
    """What a harness can do between a walk and a read: a real directory becomes a link."""
    shutil.rmtree(directory)
    directory.symlink_to(host_dir, target_is_directory=True)


def test_every_file_reader_refuses_a_planted_directory_link(tmp_path: Path, host_dir: Path) -> None:
    root = _workspace(tmp_path)
    _plant(root, host_dir)
    path = root / "sub" / "secret.txt"
    for root_given in (root, None):  # named beneath the workspace, or a bare path
        with pytest.raises(UnsafeFile, match="symbolic link"):
            read_regular(path, root=root_given)
        with pytest.raises(UnsafeFile), open_regular(path, root=root_given):
            pass
        with pytest.raises(UnsafeFile):
            lstat_beneath(path, root_given)
        with pytest.raises(UnsafeFile):
            copy_regular(path, tmp_path / "copy", src_root=root_given)
        assert not same_content(path, host_dir / "secret.txt", root_a=root_given)
        assert read_log(path, root=root_given) is None
    assert not (tmp_path / "copy").exists()
    with pytest.raises(UnsafeFile, match=r"'\.\.'"):
        read_regular(root / "src" / ".." / ".." / "host" / "secret.txt", root=root)
    with pytest.raises(UnsafeFile, match="not beneath"):
        read_regular(host_dir / "secret.txt", root=root)


def test_the_snapshot_has_no_entry_behind_a_directory_link(tmp_path: Path, host_dir: Path) -> None:
    root = _workspace(tmp_path)
    _plant(root, host_dir)
    snapshot = HostSnapshot(root)
    assert snapshot.entry("sub") is not None and snapshot.entry("sub").kind == "link"
    assert snapshot.entry("sub/secret.txt") is None  # it was reported as a plain file
    with pytest.raises(UnsafeFile):
        snapshot.read("sub/secret.txt")
    with pytest.raises(UnsafeFile):
        snapshot.copy_to("sub/secret.txt", tmp_path / "out.txt")
    listed = dict(snapshot.walk())
    assert "sub" in listed and not any(rel.startswith("sub/") for rel in listed)
    other = HostSnapshot(host_dir)
    assert not snapshot.same_file("sub/secret.txt", other)


def test_a_directory_swapped_for_a_link_mid_walk_is_not_entered(
    tmp_path: Path, host_dir: Path
) -> None:
    root = _workspace(tmp_path)
    (root / "sub").mkdir()
    (root / "sub" / "mine.txt").write_text("mine")
    seen: list[str] = []
    for rel, entry in walk(root):
        seen.append(rel)
        if rel == "sub":  # listed as a directory; swapped before the walk descends
            assert entry.is_dir
            _swap_for_link(root / "sub", host_dir)
    assert "sub" in seen
    assert not any(rel.startswith("sub/") for rel in seen)


def test_a_directory_swapped_after_the_walk_reaches_no_reader(
    tmp_path: Path, host_dir: Path
) -> None:
    """The diff is taken while ``sub`` is real; by the time the patch, the clean copy's apply
    and the copy-out read it, ``sub`` leads to the host."""
    agent, base = _workspace(tmp_path, "agent"), _workspace(tmp_path, "base")
    (agent / "sub").mkdir()
    (agent / "sub" / "secret.txt").write_text("the agent's own\n")
    diff = diff_trees(HostSnapshot(agent), HostSnapshot(base))
    assert "sub/secret.txt" in diff.changed
    _swap_for_link(agent / "sub", host_dir)

    patch, _ = unified_patch(diff, HostSnapshot(agent), HostSnapshot(base), 1 << 20)
    assert SECRET.decode() not in patch
    report = apply_diff(diff, HostSnapshot(agent), HostWriter(base))
    assert "sub/secret.txt" in report.conflicts
    assert not (base / "sub" / "secret.txt").exists()
    with pytest.raises(UnsafeFile):
        copy_tree(agent / "sub" / "secret.txt", tmp_path / "out", src_root=agent)
    assert not (tmp_path / "out").exists()


def test_a_tree_copy_refuses_a_directory_link_on_either_side(
    tmp_path: Path, host_dir: Path
) -> None:
    workspace = _workspace(tmp_path)
    _plant(workspace, host_dir)
    copy_tree(workspace / "sub", tmp_path / "dl" / "sub", src_root=workspace)
    assert (tmp_path / "dl" / "sub").is_symlink()  # the link itself, as a link
    with pytest.raises(UnsafeFile):
        copy_tree(workspace / "sub" / "secret.txt", tmp_path / "dl.txt", src_root=workspace)
    upload = tmp_path / "upload"
    upload.mkdir()
    (upload / "evil.txt").write_text("evil")
    with pytest.raises(UnsafeFile):  # into the sandbox, through its link
        copy_tree(upload, workspace / "sub" / "deeper", dst_root=workspace)
    with pytest.raises(UnsafeFile):
        write_regular(workspace / "sub" / "secret.txt", b"overwritten", root=workspace)
    assert sorted(os.listdir(host_dir)) == ["secret.txt"]
    assert (host_dir / "secret.txt").read_bytes() == SECRET
    copy_tree(workspace / "src", tmp_path / "fine", src_root=workspace)  # a real tree copies
    assert (tmp_path / "fine" / "ok.py").read_text() == "x = 1\n"


def test_the_clean_copy_is_never_changed_through_its_own_links(
    tmp_path: Path, host_dir: Path
) -> None:
    """The fresh workspace a diff is replayed onto may hold a link where the agent's tree
    has a directory: writes, links and deletions there stay off the host."""
    agent, base = _workspace(tmp_path, "agent"), _workspace(tmp_path, "base")
    (agent / "sub").mkdir()
    (agent / "sub" / "secret.txt").write_text("replaced\n")
    (agent / "sub" / "new.txt").write_text("new\n")
    _plant(base, host_dir)
    diff = WorkspaceDiff(changed=["sub/new.txt", "sub/secret.txt"], deleted=["sub/secret.txt"])
    report = apply_diff(diff, HostSnapshot(agent), HostWriter(base))
    assert set(report.conflicts) >= {"sub/new.txt", "sub/secret.txt"}
    assert sorted(os.listdir(host_dir)) == ["secret.txt"]
    assert (host_dir / "secret.txt").read_bytes() == SECRET
    writer = HostWriter(base)
    with pytest.raises(UnsafeFile):
        writer.link("sub/l", "/etc/passwd")
    assert not writer.remove_empty_dir("sub")
    assert host_dir.is_dir()


def test_handing_a_tree_over_never_touches_a_linked_host_file(
    tmp_path: Path, host_dir: Path
) -> None:
    (host_dir / "secret.txt").chmod(0o600)
    workspace = _workspace(tmp_path)
    _plant(workspace, host_dir)
    (workspace / "src" / "ok.py").chmod(0o600)
    hand_over_tree(workspace, None, root=workspace)
    assert (workspace / "src" / "ok.py").stat().st_mode & 0o666 == 0o666
    assert (host_dir / "secret.txt").stat().st_mode & 0o777 == 0o600
    with pytest.raises(UnsafeFile):
        hand_over_tree(workspace / "sub" / "secret.txt", None, root=workspace)
    assert (host_dir / "secret.txt").stat().st_mode & 0o777 == 0o600


async def test_a_runtime_transfer_refuses_a_planted_directory_link(
    tmp_path: Path, host_dir: Path
) -> None:
    runtime = create_runtime(RuntimeSpec(kind="local"), tmp_path / "s", "http://127.0.0.1:9")
    await runtime.start()
    try:
        _plant(runtime.workspace_path, host_dir)
        (runtime.workspace_path / "real").mkdir()
        (runtime.workspace_path / "real" / "out.txt").write_text("out")
        with pytest.raises((UnsafeFile, ValueError)):
            await runtime.download("sub/secret.txt", tmp_path / "got.txt")
        assert not (tmp_path / "got.txt").exists()
        upload = tmp_path / "up.txt"
        upload.write_text("evil")
        with pytest.raises((UnsafeFile, ValueError)):
            await runtime.upload(upload, "sub/planted.txt")
        assert sorted(os.listdir(host_dir)) == ["secret.txt"]
        await runtime.download("real", tmp_path / "real-copy")
        assert (tmp_path / "real-copy" / "out.txt").read_text() == "out"
        await runtime.upload(upload, "real/up.txt")
        assert (runtime.workspace_path / "real" / "up.txt").read_text() == "evil"
    finally:
        await runtime.stop()
