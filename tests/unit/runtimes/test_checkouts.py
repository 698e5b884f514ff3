"""Cached host checkouts of a git workspace source: by commit, branch or bundle; the history
they keep; the cache; concurrent sessions; and the errors a user sees."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from polar.errors import RuntimeStartError
from polar.runtimes import checkouts
from polar.runtimes.checkouts import checkout, default_cache_dir, shared_checkout

from .conftest import GitRepo, git


def has_object(repo: Path, sha: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", sha], cwd=repo).returncode == 0


def assert_clean_checkout(tree: Path, sha: str) -> None:
    assert git(tree, "rev-parse", "HEAD") == sha
    assert git(tree, "status", "--porcelain") == ""
    assert git(tree, "remote") == ""
    assert subprocess.run(["git", "symbolic-ref", "-q", "HEAD"], cwd=tree).returncode != 0


def test_a_commit_is_checked_out_detached_without_later_history(git_repo: GitRepo, tmp_path: Path):
    tree = checkout(str(git_repo.path), git_repo.first, tmp_path / "cache")
    assert_clean_checkout(tree, git_repo.first)
    assert (tree / "app.py").read_text() == "VALUE = 1\n"
    assert not (tree / "notes.txt").exists()
    assert (tree / "link.py").is_symlink() and (tree / "run.sh").stat().st_mode & 0o111
    assert not has_object(tree, git_repo.second)  # the fix to come is not in the history
    assert git(tree, "log", "--all", "--format=%s") == "one"


@pytest.mark.parametrize("commit", [None, "main", "HEAD~0", "abbrev"])
def test_commits_resolve_in_the_repository(git_repo: GitRepo, tmp_path: Path, commit: str | None):
    if commit == "abbrev":
        commit = git_repo.second[:10]
    tree = checkout(str(git_repo.path), commit, tmp_path / "cache")
    assert_clean_checkout(tree, git_repo.second)
    assert (tree / "notes.txt").read_text() == "later\n"


@pytest.mark.parametrize("which", ["first", "head", "branch", "abbrev"])
def test_a_bundle_is_checked_out_keeping_only_the_commits_history(
    git_repo: GitRepo, tmp_path: Path, which: str, monkeypatch: pytest.MonkeyPatch
):
    bundle = tmp_path / "repo.bundle"
    git(git_repo.path, "bundle", "create", str(bundle), "--all")
    commit, sha = {
        "first": (git_repo.first, git_repo.first),
        "head": (None, git_repo.second),
        "branch": ("main", git_repo.second),
        "abbrev": (git_repo.first[:9], git_repo.first),
    }[which]
    tree = checkout(str(bundle), commit, tmp_path / "cache")
    assert_clean_checkout(tree, sha)
    assert (tree / "app.py").read_text() == (
        "VALUE = 1\n" if sha == git_repo.first else "VALUE = 2\n"
    )
    assert has_object(tree, git_repo.second) == (sha == git_repo.second)
    assert git(tree, "for-each-ref") == ""
    monkeypatch.setattr(checkouts, "_build", None)  # a second build would fail
    assert checkout(str(bundle), commit, tmp_path / "cache") == tree


def test_the_cache_is_reused(git_repo: GitRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cache = tmp_path / "cache"
    tree = checkout(str(git_repo.path), git_repo.first, cache)
    inode = (tree / ".git").stat().st_ino

    def no_second_build(*args: object) -> Path:
        raise AssertionError("the cached checkout was built again")

    monkeypatch.setattr(checkouts, "_build", no_second_build)
    # The same repository by another spelling of its path, the same commit by a branch name.
    (tmp_path / "alias").symlink_to(git_repo.path)
    git(git_repo.path, "branch", "old", git_repo.first)
    again = checkout(str(tmp_path / "alias"), "old", cache)
    assert again == tree and (again / ".git").stat().st_ino == inode
    assert [p.name for p in tree.parent.iterdir() if p.name.startswith(".tmp-")] == []


def test_concurrent_checkouts_build_once(
    git_repo: GitRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    builds: list[str] = []
    real_build = checkouts._build

    def counting_build(*args: object) -> Path:
        builds.append("built")
        return real_build(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(checkouts, "_build", counting_build)
    with ThreadPoolExecutor(8) as pool:
        trees = list(
            pool.map(lambda _: checkout(str(git_repo.path), None, tmp_path / "cache"), range(8))
        )
    assert len(set(trees)) == 1 and builds == ["built"]
    assert_clean_checkout(trees[0], git_repo.second)


def test_a_lost_rename_race_uses_the_winners_checkout(
    git_repo: GitRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Where locks do not hold (a network filesystem), concurrent builds all finish and the
    first rename wins; the others drop their copies."""
    monkeypatch.setattr(checkouts, "_locked", lambda path: contextlib.nullcontext())
    barrier = threading.Barrier(4)
    real_build = checkouts._build

    def build_together(*args: object) -> Path:
        barrier.wait(timeout=30)
        return real_build(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(checkouts, "_build", build_together)
    cache = tmp_path / "cache"
    with ThreadPoolExecutor(4) as pool:
        trees = list(pool.map(lambda _: checkout(str(git_repo.path), None, cache), range(4)))
    assert len(set(trees)) == 1
    assert_clean_checkout(trees[0], git_repo.second)
    assert sorted(p.name for p in trees[0].parent.iterdir() if not p.name.endswith(".lock")) == [
        git_repo.second
    ]


async def test_sessions_of_one_process_share_one_checkout_call(
    git_repo: GitRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    calls: list[str] = []
    real_checkout = checkouts.checkout

    def counting_checkout(repo: str, commit: str | None, cache_dir: Path) -> Path:
        calls.append(repo)
        return real_checkout(repo, commit, cache_dir)

    monkeypatch.setattr(checkouts, "checkout", counting_checkout)
    cache = tmp_path / "cache"
    waiters = [
        asyncio.ensure_future(shared_checkout(str(git_repo.path), git_repo.first, cache))
        for _ in range(6)
    ]
    await asyncio.sleep(0)
    waiters[0].cancel()  # one session gives up; the others still get their checkout
    trees = await asyncio.gather(*waiters[1:])
    assert len(set(trees)) == 1 and len(calls) == 1
    assert_clean_checkout(trees[0], git_repo.first)
    assert waiters[0].cancelled()
    # Done, it is not pending any more: a later session checks the cache itself.
    assert await shared_checkout(str(git_repo.path), git_repo.first, cache) == trees[0]
    assert len(calls) == 2


def test_an_unknown_commit_names_itself_and_the_repository(git_repo: GitRepo, tmp_path: Path):
    with pytest.raises(RuntimeStartError, match=r"commit deadbeef is not in .*repo"):
        checkout(str(git_repo.path), "deadbeef", tmp_path / "cache")
    bundle = tmp_path / "repo.bundle"
    git(git_repo.path, "bundle", "create", str(bundle), "--all")
    missing = "0123456789" * 4
    with pytest.raises(RuntimeStartError, match=f"commit {missing} is not in .*repo.bundle"):
        checkout(str(bundle), missing, tmp_path / "cache")
    with pytest.raises(RuntimeStartError, match="is not a commit"):
        checkout(str(git_repo.path), "--upload-pack=evil", tmp_path / "cache")


def test_what_is_no_repository_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeStartError, match=r"repository .*nowhere does not exist"):
        checkout(str(tmp_path / "nowhere"), None, cache)
    (tmp_path / "plain").mkdir()
    with pytest.raises(RuntimeStartError, match="plain is not a git repository"):
        checkout(str(tmp_path / "plain"), None, cache)
    (tmp_path / "file.txt").write_text("no bundle")
    with pytest.raises(RuntimeStartError, match="neither a git repository nor a git bundle"):
        checkout(str(tmp_path / "file.txt"), None, cache)
    monkeypatch.setattr(checkouts.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeStartError, match="needs git on the host"):
        checkout(str(tmp_path / "plain"), None, cache)


def test_the_cache_dir_defaults_under_home_and_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("POLAR_CHECKOUT_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("POLAR_CHECKOUT_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "polar" / "checkouts"
