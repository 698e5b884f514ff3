"""What a sandbox can plant in its tree costs the host nothing: the traps a harness can make (a
FIFO, a device node, a huge sparse file, a deep symlink chain, a link out, a vast or deep tree)
are refused at once by every host-side read, copy, comparison and walk, and by the runtime's
transfers and the evaluators' diff, patch text and apply that stand on them."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.evaluators.patch_text import unified_patch
from polar.evaluators.pytest_config import changes_pytest_config
from polar.evaluators.swe_tests import LOG_LIMIT, read_log
from polar.evaluators.workspace_diff import apply_diff, diff_trees
from polar.runtimes.registry import create_runtime
from polar.runtimes.safe_files import (
    TreeTooLarge,
    UnsafeFile,
    copy_regular,
    copy_tree,
    make_dirs,
    read_regular,
    same_content,
    walk,
)
from polar.runtimes.snapshot import HostSnapshot
from polar.runtimes.workspace_writer import HostWriter
from polar.schemas.task import RuntimeSpec

TRAPS = ("fifo", "device", "sparse", "chain", "link_out")
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4)


def bounded(call: Callable[[], Any], seconds: float = 10.0) -> Any:
    """``call()``'s value or exception; a call that blocks fails the test instead of hanging
    it (the stuck thread is released when the FIFOs are opened for writing at teardown)."""
    future = _POOL.submit(call)
    try:
        return future.result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        pytest.fail(f"blocked for {seconds:g}s")


def plant(where: Path, trap: str) -> Path:
    """One trap at ``where``; skips when this machine cannot make it."""
    where.parent.mkdir(parents=True, exist_ok=True)
    if trap == "fifo":
        os.mkfifo(where)
    elif trap == "device":
        try:
            os.mknod(where, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
        except PermissionError:
            pytest.skip("making a device node needs CAP_MKNOD")
    elif trap == "sparse":
        with where.open("wb") as handle:
            handle.truncate(1 << 40)  # a terabyte of nothing
    elif trap == "chain":
        previous = where.parent / "chain-end"
        previous.write_text("end")
        for index in range(60):
            link = where.parent / f"chain-{index}"
            link.symlink_to(previous.name)
            previous = link
        where.symlink_to(previous.name)
    elif trap == "link_out":
        where.symlink_to("/etc/hostname")
    return where


@pytest.fixture(autouse=True)
def release_fifos(tmp_path: Path) -> Iterator[None]:
    yield
    for path in tmp_path.rglob("*"):
        if path.is_fifo():
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.parametrize("trap", TRAPS)
def test_reads_refuse_every_trap_at_once(tmp_path: Path, trap: str) -> None:
    path = plant(tmp_path / "trap", trap)
    with pytest.raises(UnsafeFile):
        bounded(lambda: read_regular(path))
    regular = tmp_path / "regular"
    regular.write_bytes(b"\0" * 10)
    assert bounded(lambda: same_content(path, regular)) is False
    assert bounded(lambda: same_content(path, path)) is False
    with pytest.raises(UnsafeFile):
        bounded(lambda: copy_regular(path, tmp_path / "copy"))
    assert not (tmp_path / "copy").exists()
    log = bounded(lambda: read_log(path))
    if trap == "sparse":  # a log's head and tail only
        assert log is not None and len(log) < LOG_LIMIT + 100
    else:
        assert log is None


def test_a_regular_file_reads_copies_and_compares(tmp_path: Path) -> None:
    src = tmp_path / "a"
    src.write_bytes(b"hello")
    src.chmod(0o755)
    assert read_regular(src) == b"hello"
    copy_regular(src, tmp_path / "b")
    assert (tmp_path / "b").read_bytes() == b"hello"
    assert stat.S_IMODE((tmp_path / "b").stat().st_mode) == 0o755
    assert same_content(src, tmp_path / "b")
    with pytest.raises(UnsafeFile):
        read_regular(src, limit=4)


@pytest.mark.parametrize("trap", ["fifo", "link_out"])
def test_a_copy_never_writes_through_a_planted_target(tmp_path: Path, trap: str) -> None:
    src = tmp_path / "src"
    src.write_text("payload")
    target = plant(tmp_path / "dst", trap)
    with pytest.raises(OSError):  # ENXIO for a FIFO with no reader: refused, never blocking
        bounded(lambda: copy_regular(src, target))
    assert Path("/etc/hostname").read_text() != "payload"


def test_walks_stop_at_their_bounds(tmp_path: Path) -> None:
    for index in range(50):
        (tmp_path / f"f{index}").touch()
    with pytest.raises(TreeTooLarge):
        list(walk(tmp_path, max_entries=20))
    deep = tmp_path / "deep"
    here = deep
    for _ in range(10):
        here = here / "d"
    here.mkdir(parents=True)
    with pytest.raises(TreeTooLarge):
        list(walk(deep, max_depth=5))
    (tmp_path / "out").symlink_to("/", target_is_directory=True)
    listed = dict(walk(tmp_path))
    assert "out" in listed and not any(rel.startswith("out/") for rel in listed)


def test_a_huge_tree_fails_the_diff_instead_of_running_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("polar.runtimes.safe_files.MAX_ENTRIES", 100)
    agent, base = tmp_path / "agent", tmp_path / "base"
    agent.mkdir()
    base.mkdir()
    for index in range(500):
        (agent / f"f{index}").touch()
    with pytest.raises(TreeTooLarge):
        diff_trees(HostSnapshot(agent), HostSnapshot(base))


@pytest.mark.parametrize("trap", TRAPS)
def test_the_evaluators_diff_patch_and_apply_pass_over_a_trap(tmp_path: Path, trap: str) -> None:
    agent, base = tmp_path / "agent", tmp_path / "base"
    for tree in (agent, base):
        (tree / "src").mkdir(parents=True)
        (tree / "src" / "ok.py").write_text("x = 1\n")
        (tree / "setup.cfg").write_text("[tool:pytest]\n")
    (agent / "src" / "ok.py").write_text("x = 2\n")
    plant(agent / "src" / "trap", trap)
    plant(agent / "setup.cfg.d" / "trap", trap)
    (agent / "setup.cfg").unlink()
    plant(agent / "setup.cfg", trap)

    diff = bounded(lambda: diff_trees(HostSnapshot(agent), HostSnapshot(base)))
    assert "src/ok.py" in diff.changed and "src/trap" in diff.changed
    assert (
        bounded(lambda: changes_pytest_config("setup.cfg", HostSnapshot(agent), HostSnapshot(base)))
        is True
    )
    patch, _ = bounded(
        lambda: unified_patch(diff, HostSnapshot(agent), HostSnapshot(base), 1 << 20)
    )
    assert "+x = 2" in patch
    report = bounded(lambda: apply_diff(diff, HostSnapshot(agent), HostWriter(base)))
    assert "src/ok.py" in report.applied
    assert (base / "src" / "ok.py").read_text() == "x = 2\n"
    if trap in ("chain", "link_out"):  # a link is copied as a link, never followed
        assert (base / "src" / "trap").is_symlink()
    else:
        assert "src/trap" in report.conflicts
        assert not (base / "src" / "trap").exists()


@pytest.mark.parametrize("trap", TRAPS)
def test_a_transfer_out_of_a_sandbox_refuses_a_trap(tmp_path: Path, trap: str) -> None:
    tree = tmp_path / "workspace" / "out"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "kept.txt").write_text("kept")
    plant(tree / "sub" / "trap", trap)
    dest, single = tmp_path / "host", tmp_path / "single"
    if trap in ("chain", "link_out"):  # links are copied as links, never followed
        bounded(lambda: copy_tree(tree, dest))
        assert (dest / "sub" / "trap").is_symlink()
        assert (dest / "sub" / "kept.txt").read_text() == "kept"
        bounded(lambda: copy_tree(tree / "sub" / "trap", single))
        assert single.is_symlink()
        return
    with pytest.raises(UnsafeFile):
        bounded(lambda: copy_tree(tree, dest))
    with pytest.raises(UnsafeFile):
        bounded(lambda: copy_tree(tree / "sub" / "trap", single))


def test_a_transfer_into_a_sandbox_never_writes_through_a_planted_directory_link(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "host-secret-dir"
    outside.mkdir()
    src = tmp_path / "tests"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "test_x.py").write_text("evil")
    workspace_tests = tmp_path / "workspace" / "tests"
    workspace_tests.mkdir(parents=True)
    (workspace_tests / "sub").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafeFile):
        copy_tree(src, workspace_tests)
    assert list(outside.iterdir()) == []


def test_directories_are_never_made_through_a_planted_link(tmp_path: Path) -> None:
    outside = tmp_path / "host"
    outside.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    (home / ".polar").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafeFile):
        make_dirs(home, ".polar/artifacts")
    assert list(outside.iterdir()) == []
    (home / ".polar").unlink()
    assert make_dirs(home, ".polar/artifacts").is_dir()


async def test_a_runtime_makes_directories_inside_only_and_never_through_a_link(
    tmp_path: Path,
) -> None:
    runtime = create_runtime(RuntimeSpec(kind="local"), tmp_path / "s", "http://127.0.0.1:9")
    await runtime.start()
    try:
        outside = tmp_path / "host"
        outside.mkdir()
        (runtime.home_path / ".polar").symlink_to(outside, target_is_directory=True)
        with pytest.raises(UnsafeFile):
            await runtime.make_dirs(f"{runtime.home}/.polar/logs")
        assert list(outside.iterdir()) == []
        with pytest.raises(ValueError, match="outside the local runtime's workdir"):
            await runtime.make_dirs(str(outside / "x"))
        await runtime.make_dirs("build/out", f"{runtime.home}/cache")
        assert (runtime.workspace_path / "build" / "out").is_dir()
        assert (runtime.home_path / "cache").is_dir()
    finally:
        await runtime.stop()
