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
from pathlib import PurePosixPath
from typing import Any

from polar.runtimes.snapshot import WorkspaceSnapshot

SECTIONS = {"setup.cfg": ("tool:pytest", "pytest"), "tox.ini": ("pytest",)}
CONFIG_FILES = frozenset({*SECTIONS, "pyproject.toml"})
_LARGEST_CONFIG = 4 * 1024 * 1024


class _Unreadable(Exception):
    pass


def _pytest_settings(tree: WorkspaceSnapshot, rel: str) -> Any:
    """The pytest part of one config file; None when there is none (or no file)."""
    entry = tree.entry(rel)
    if entry is None:
        return None
    name = PurePosixPath(rel).name
    if entry.kind != "file":
        raise _Unreadable(rel)
    try:
        text = tree.read(rel, _LARGEST_CONFIG).decode()
        if name == "pyproject.toml":
            return tomllib.loads(text).get("tool", {}).get("pytest") or None
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        parser.read_string(text)
    except (OSError, UnicodeDecodeError, ValueError, configparser.Error) as exc:
        raise _Unreadable(rel) from exc
    sections = SECTIONS[name]
    return {name: dict(parser[name]) for name in sections if parser.has_section(name)} or None


def changes_pytest_config(rel: str, agent: WorkspaceSnapshot, base: WorkspaceSnapshot) -> bool:
    """Whether the agent's ``rel`` (a changed or deleted path) alters pytest's settings."""
    if PurePosixPath(rel).name not in CONFIG_FILES:
        return False
    try:
        return bool(_pytest_settings(agent, rel) != _pytest_settings(base, rel))
    except _Unreadable:
        return True
