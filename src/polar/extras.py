"""Optional installs: which packages each extra brings, and the error that names the extra.

``pip install polar`` runs the gateway, the rollout server, builders, exporters and the CLI
without torch or transformers. A capability that needs more checks for its packages where it
starts, so a core install gets one sentence naming the extra to install instead of an
``ImportError`` from deep inside a module. See docs/install.md.
"""

from __future__ import annotations

import importlib.util

from polar.errors import ConfigError

# The top-level modules Polar itself imports from each extra (not every package it installs).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "render": ("transformers",),
    "deepseek": ("transformers", "miles_tito_tokenizers"),
    "embedded": ("torch", "transformers", "gguf"),
    "parquet": ("pyarrow",),
    "train": ("torch", "transformers", "gguf"),
    "swe": ("swebench",),
}


class MissingExtra(ConfigError):
    """A capability whose optional packages are not installed."""

    def __init__(self, extra: str, purpose: str, missing: list[str]) -> None:
        super().__init__(
            f"{purpose} needs {', '.join(missing)}, which the core install leaves out: "
            f"pip install 'polar[{extra}]'"
        )
        self.extra = extra
        self.missing = missing


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here."""
    return [name for name in EXTRA_MODULES[extra] if not _importable(name)]


def installed(extra: str) -> bool:
    return not missing(extra)


def require(extra: str, purpose: str) -> None:
    """Raise :class:`MissingExtra` unless ``extra``'s modules are installed."""
    if absent := missing(extra):
        raise MissingExtra(extra, purpose, absent)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
