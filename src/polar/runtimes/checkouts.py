"""Cached git checkouts on the host, the starting tree of a ``git`` workspace source.

A task names a repository (a host path of a git repository or a ``git bundle`` file) and a
commit; thousands of sessions of it must not clone thousands of times. :func:`checkout` makes
one complete checkout per (repository, commit) under the cache directory and returns it; each
session copies it into its workspace. A checkout is built in a temporary directory and renamed
into place, so a reader never sees half of one; a lock file per key lets concurrent sessions
(threads or processes) wait for the one build instead of each making their own, and a lost
rename race is tolerated where locks do not hold (network filesystems).

A checkout holds the history up to its commit and nothing later: it is fetched by commit, not
cloned, so the commit that fixed a task's bug is not one ``git log --all`` away from the agent.
Its ``HEAD`` is detached at the commit and it has no remote.

Git runs with a clean configuration (no system or global config, no hooks, no prompts), so the
host user's settings cannot change what a checkout contains.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from polar.errors import RuntimeStartError

CACHE_ENV = "POLAR_CHECKOUT_CACHE"
GIT_TIMEOUT_S = 1800.0
_FULL_SHA = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")
# Where a bundle's refs land while its commit is found, deleted before the checkout is kept.
_SOURCE_REFS = "refs/polar-source"


def default_cache_dir() -> Path:
    """``$POLAR_CHECKOUT_CACHE``, else ``~/.cache/polar/checkouts``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "polar" / "checkouts"


# Checkouts being made in this process, by (repo, commit, cache dir): the sessions that ask for
# one meanwhile await the same thread instead of each holding a worker thread on the lock.
_pending: dict[tuple[str, str | None, Path], asyncio.Future[Path]] = {}


async def shared_checkout(repo: str, commit: str | None, cache_dir: Path) -> Path:
    """:func:`checkout` from an event loop: in a worker thread, one per key at a time."""
    key = (repo, commit, cache_dir)
    loop = asyncio.get_running_loop()
    pending = _pending.get(key)
    if pending is None or pending.get_loop() is not loop:
        pending = asyncio.ensure_future(asyncio.to_thread(checkout, repo, commit, cache_dir))
        _pending[key] = pending
        pending.add_done_callback(lambda done: _forget(key, done))
    # One session cancelled (its task timed out) must not cancel the others' checkout.
    return await asyncio.shield(pending)


def _forget(key: tuple[str, str | None, Path], done: asyncio.Future[Path]) -> None:
    if _pending.get(key) is done:
        del _pending[key]
    if not done.cancelled():
        done.exception()  # retrieved: an error is each waiter's to raise, not an orphan's


def checkout(repo: str, commit: str | None, cache_dir: Path) -> Path:
    """A complete checkout (with ``.git``) of ``repo`` at ``commit`` (default ``HEAD``).

    Blocking (git and the filesystem): from an event loop, await :func:`shared_checkout`.
    Raises :class:`RuntimeStartError` naming the repository and commit when git is missing,
    the repository does not exist or is not one, or the commit is not in it.
    """
    if shutil.which("git") is None:
        raise RuntimeStartError(
            "a git workspace source needs git on the host (apt-get install git)"
        )
    if commit is not None and (not commit or commit.startswith("-")):
        raise RuntimeStartError(f"git workspace source: {commit!r} is not a commit of {repo}")
    source = Path(os.path.realpath(Path(repo).expanduser()))
    if not source.exists():
        raise RuntimeStartError(f"git workspace source: repository {repo} does not exist")
    bundle = source.is_file()
    sha = _bundle_sha(source, repo, commit) if bundle else _repo_sha(source, repo, commit)
    repo_dir = cache_dir / _repo_key(source)
    repo_dir.mkdir(parents=True, exist_ok=True)
    # A commit only unbundling resolves (an abbreviated sha) is remembered once it has been.
    alias = repo_dir / f".ref-{hashlib.sha256((commit or 'HEAD').encode()).hexdigest()[:16]}"
    if sha is None and alias.is_file():
        sha = alias.read_text().strip()
    if sha is not None and (repo_dir / sha).is_dir():
        return repo_dir / sha
    with _locked(repo_dir / f".{sha or alias.name}.lock"):
        if sha is not None and (repo_dir / sha).is_dir():
            return repo_dir / sha
        tree = _build(source, repo, commit, sha, bundle, repo_dir)
        if sha is None:
            temp = alias.with_name(f"{alias.name}.{secrets.token_hex(4)}")
            temp.write_text(tree.name)
            os.replace(temp, alias)
        return tree


def _build(
    source: Path, repo: str, commit: str | None, sha: str | None, bundle: bool, repo_dir: Path
) -> Path:
    work = repo_dir / f".tmp-{secrets.token_hex(6)}"
    try:
        _git(["init", "-q", str(work)], repo, commit)
        if bundle:
            sha = _fetch_bundle(work, source, repo, commit, sha)
        else:
            assert sha is not None
            _git(["fetch", "-q", "--no-tags", "--no-write-fetch-head", str(source), sha],
                 repo, commit, cwd=work)  # fmt: skip
        _git(["checkout", "-q", "--detach", sha], repo, commit, cwd=work)
        if bundle:
            _drop_the_rest(work, repo, commit)
        final = repo_dir / sha
        try:
            os.rename(work, final)
        except OSError:
            if not final.is_dir():
                raise
            # Another process built the same checkout first (no lock held here): use theirs.
        return final
    except OSError as exc:
        raise RuntimeStartError(
            f"git workspace source: could not check out {commit or 'HEAD'} of {repo}: {exc}"
        ) from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _fetch_bundle(work: Path, source: Path, repo: str, commit: str | None, sha: str | None) -> str:
    """Unbundle into ``work`` (under :data:`_SOURCE_REFS`) and find the commit there."""
    _git(["fetch", "-q", "--no-tags", "--no-write-fetch-head", str(source),
          f"+refs/*:{_SOURCE_REFS}/*"], repo, commit, cwd=work)  # fmt: skip
    if sha is None:
        return _rev_parse(work, repo, commit)
    if not _git_ok(["cat-file", "-e", f"{sha}^{{commit}}"], cwd=work):
        raise _unknown(repo, commit)
    return sha


def _drop_the_rest(work: Path, repo: str, commit: str | None) -> None:
    """Delete the bundle's refs and every object the checked-out commit does not reach."""
    refs = _git(["for-each-ref", "--format=delete %(refname)", _SOURCE_REFS], repo, commit,
                cwd=work)  # fmt: skip
    _git(["update-ref", "--stdin"], repo, commit, cwd=work, stdin=refs)
    _git(["repack", "-a", "-d", "-q"], repo, commit, cwd=work)
    _git(["prune", "--expire=now"], repo, commit, cwd=work)


def _repo_sha(source: Path, repo: str, commit: str | None) -> str:
    if not _git_ok(["rev-parse", "--git-dir"], cwd=source):
        raise RuntimeStartError(f"git workspace source: {repo} is not a git repository")
    return _rev_parse(source, repo, commit)


def _bundle_sha(source: Path, repo: str, commit: str | None) -> str | None:
    """The commit's sha from the bundle's heads, or None when only unbundling can tell (an
    abbreviated sha, a commit that is no head)."""
    try:
        listing = _git(["bundle", "list-heads", str(source)], repo, commit)
    except RuntimeStartError as exc:
        raise RuntimeStartError(
            f"git workspace source: {repo} is neither a git repository nor a git bundle",
            stderr_tail=exc.stderr_tail,
        ) from exc
    heads = {ref: sha for sha, _, ref in (line.partition(" ") for line in listing.splitlines())}
    wanted = commit or "HEAD"
    for name in (wanted, f"refs/heads/{wanted}", f"refs/tags/{wanted}"):
        if name in heads:
            return heads[name]
    if commit is None:
        raise RuntimeStartError(
            f"git workspace source: the bundle {repo} has no HEAD; name a commit"
        )
    return commit if _FULL_SHA.fullmatch(commit) else None


def _rev_parse(where: Path, repo: str, commit: str | None) -> str:
    try:
        return _git(["rev-parse", "--verify", "-q", f"{commit or 'HEAD'}^{{commit}}"],
                    repo, commit, cwd=where).strip()  # fmt: skip
    except RuntimeStartError as exc:
        raise _unknown(repo, commit) from exc


def _unknown(repo: str, commit: str | None) -> RuntimeStartError:
    return RuntimeStartError(f"git workspace source: commit {commit or 'HEAD'} is not in {repo}")


def _repo_key(source: Path) -> str:
    """A cache directory name: readable, and unique to the repository's real path."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", source.name)[:40] or "repo"
    return f"{name}-{hashlib.sha256(str(source).encode()).hexdigest()[:16]}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _git_env() -> dict[str, str]:
    """Only what git needs: the host's GIT_DIR, config and hooks must not leak in."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/"),
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
    }


# The repository may belong to another user (a shared data dir): reading it is the point.
_GIT = ["git", "-c", "safe.directory=*", "-c", f"core.hooksPath={os.devnull}"]


def _run(args: list[str], cwd: Path | None, stdin: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_GIT, *args],
        cwd=cwd,
        env=_git_env(),
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_S,
    )


def _git(
    args: list[str],
    repo: str,
    commit: str | None,
    *,
    cwd: Path | None = None,
    stdin: str | None = None,
) -> str:
    """Run git; its stdout, or a :class:`RuntimeStartError` naming repository and commit."""
    try:
        done = _run(args, cwd, stdin)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeStartError(
            f"git workspace source: git {args[0]} for {commit or 'HEAD'} of {repo} timed out "
            f"after {GIT_TIMEOUT_S:g}s"
        ) from exc
    if done.returncode != 0:
        raise RuntimeStartError(
            f"git workspace source: git {args[0]} failed for {commit or 'HEAD'} of {repo}",
            command="git " + " ".join(args),
            exit_code=done.returncode,
            stderr_tail=done.stderr.strip()[-2000:],
        )
    return done.stdout


def _git_ok(args: list[str], *, cwd: Path) -> bool:
    try:
        return _run(args, cwd, None).returncode == 0
    except subprocess.TimeoutExpired:
        return False
