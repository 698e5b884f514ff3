"""Whether an agent's edit to a shared config file changes pytest's settings.

``setup.cfg``, ``tox.ini`` and ``pyproject.toml`` hold package metadata and other tools'
settings a fix may legitimately change, but also pytest's section, whose ``addopts`` can load a
plugin from the repository (``-p mymodule``) that rewrites every test outcome. So these files
are not protected whole; a change to one is discarded when its pytest section differs from the
base tree's. A file that is a symbolic link or does not parse counts as changed: it is never
followed (the agent owns its workspace) and pytest might read it differently.
"""

from __future__ import annotations

import configparser
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

from polar.runtimes.safe_files import read_regular

SECTIONS = {"setup.cfg": ("tool:pytest", "pytest"), "tox.ini": ("pytest",)}
CONFIG_FILES = frozenset({*SECTIONS, "pyproject.toml"})
_LARGEST_CONFIG = 4 * 1024 * 1024


class _Unreadable(Exception):
    pass


def _pytest_settings(path: Path) -> Any:
    """The pytest part of one config file; None when there is none (or no file)."""
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_symlink() or not path.is_file():
        raise _Unreadable(str(path))
    try:
        text = read_regular(path, _LARGEST_CONFIG).decode()
        if path.name == "pyproject.toml":
            return tomllib.loads(text).get("tool", {}).get("pytest") or None
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        parser.read_string(text)
    except (OSError, UnicodeDecodeError, ValueError, configparser.Error) as exc:
        raise _Unreadable(str(path)) from exc
    sections = SECTIONS[path.name]
    return {name: dict(parser[name]) for name in sections if parser.has_section(name)} or None


def changes_pytest_config(rel: str, agent: Path, base: Path) -> bool:
    """Whether the agent's ``rel`` (a changed or deleted path) alters pytest's settings."""
    if PurePosixPath(rel).name not in CONFIG_FILES:
        return False
    try:
        return bool(_pytest_settings(agent / rel) != _pytest_settings(base / rel))
    except _Unreadable:
        return True
