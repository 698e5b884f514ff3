"""A bundled SWE-style task set: three tiny Python repositories, each with one real bug.

Each folder here holds an instance: ``repo/`` (the tree at its base commit), ``issue.md`` (the
problem statement), ``patch.diff`` (the gold fix, source files only), ``test_patch.diff``
(tests that fail before the fix) and ``instance.yaml`` (id, repo, base_commit, the
FAIL_TO_PASS and PASS_TO_PASS test ids as ``pytest -rA`` reports them). The tests need only
the standard library and pytest, so the set runs on a laptop and in CI.

:func:`bundle_repos` turns each tree into a git repository and a ``git bundle`` with a fixed
author, committer, date and configuration, so the commit is the same on every machine and
equals the ``base_commit`` stored with the instance.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
from pathlib import Path

import yaml

from polar.errors import ConfigError
from polar.swe.instances import SWEInstance

BUNDLED = Path(__file__).parent
CACHE_ENV = "POLAR_SWE_BUNDLES"
BRANCH = "main"
# What makes the commit reproducible: who, when, and no user or system git configuration.
_IDENTITY = {
    "GIT_AUTHOR_NAME": "Polar",
    "GIT_AUTHOR_EMAIL": "polar@example.invalid",
    "GIT_AUTHOR_DATE": "1735689600 +0000",
    "GIT_COMMITTER_NAME": "Polar",
    "GIT_COMMITTER_EMAIL": "polar@example.invalid",
    "GIT_COMMITTER_DATE": "1735689600 +0000",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}
_GIT_CONFIG = ("-c", "core.autocrlf=false", "-c", "commit.gpgsign=false", "-c", "core.hooksPath=")
# Committed with every tree: test runs leave these behind, and they are not the agent's diff.
GITIGNORE = "__pycache__/\n*.pyc\n.pytest_cache/\n"
_SKIPPED = {"__pycache__", ".pytest_cache"}


def bundled_instances() -> list[SWEInstance]:
    """The bundled instances, in a fixed order."""
    return [_instance(folder) for folder in _folders()]


def bundle_repos(dest: Path) -> dict[str, Path]:
    """A ``git bundle`` of each bundled repository in ``dest`` (``<name>.bundle``), keyed by
    repo name; a bundle already there at the right commit is kept."""
    dest.mkdir(parents=True, exist_ok=True)
    bundles: dict[str, Path] = {}
    for folder in _folders():
        instance = _instance(folder)
        bundle = (dest / f"{folder.name}.bundle").resolve()
        if not bundle.is_file() or bundle_head(bundle) != instance.base_commit:
            head = build_bundle(folder / "repo", bundle)
            if head != instance.base_commit:
                raise ConfigError(
                    f"bundled repository {instance.repo} built to commit {head}, not its "
                    f"base_commit {instance.base_commit}: its files in {folder} were changed"
                )
        bundles[instance.repo] = bundle
    return bundles


def default_bundle_dir() -> Path:
    """``$POLAR_SWE_BUNDLES``, else ``~/.cache/polar/swe-bundled``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "polar" / "swe-bundled"


def build_bundle(tree: Path, bundle: Path) -> str:
    """Commit ``tree`` (plus :data:`GITIGNORE`) reproducibly and write its bundle; the commit."""
    bundle.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="polar-swe-") as work:
        repo = Path(work) / "repo"
        _copy_tree(tree, repo)
        (repo / ".gitignore").write_text(GITIGNORE)
        _git(repo, "init", "--quiet", f"--initial-branch={BRANCH}", ".")
        _git(repo, "add", "--all", ".")
        _git(repo, "commit", "--quiet", "--no-verify", "-m", f"{tree.parent.name}: initial import")
        # Written beside the target and renamed, so a reader never sees half a bundle.
        staged = bundle.with_name(f".{bundle.name}.{secrets.token_hex(4)}.tmp")
        try:
            _git(repo, "bundle", "create", "--quiet", str(staged), "HEAD", BRANCH)
            os.replace(staged, bundle)
        finally:
            staged.unlink(missing_ok=True)
        return _git(repo, "rev-parse", "HEAD").strip()


def bundle_head(bundle: Path) -> str | None:
    """The commit ``HEAD`` names in ``bundle``, or None when it is no readable bundle."""
    try:
        heads = _git(bundle.parent, "bundle", "list-heads", str(bundle))
    except ConfigError:
        return None
    for line in heads.splitlines():
        sha, _, ref = line.partition(" ")
        if ref == "HEAD":
            return sha
    return None


def _folders() -> list[Path]:
    return sorted(p for p in BUNDLED.iterdir() if (p / "instance.yaml").is_file())


def _instance(folder: Path) -> SWEInstance:
    record = yaml.safe_load((folder / "instance.yaml").read_text())
    record["problem_statement"] = (folder / "issue.md").read_text()
    record["patch"] = (folder / "patch.diff").read_text()
    record["test_patch"] = (folder / "test_patch.diff").read_text()
    record["source"] = "polar-bundled"
    return SWEInstance.model_validate(record)


def _copy_tree(tree: Path, dest: Path) -> None:
    for path in sorted(tree.rglob("*")):
        relative = path.relative_to(tree)
        if _SKIPPED & set(relative.parts) or path.suffix == ".pyc" or not path.is_file():
            continue
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())  # a fresh file: no executable bit to record


def _git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | _IDENTITY
    try:
        done = subprocess.run(
            ["git", *_GIT_CONFIG, *args], cwd=cwd, env=env, capture_output=True, text=True
        )
    except FileNotFoundError:
        raise ConfigError("the bundled SWE repositories need git (apt-get install git)") from None
    if done.returncode != 0:
        raise ConfigError(f"git {' '.join(args)} failed in {cwd}: {done.stderr.strip()}")
    return done.stdout
