"""Where Polar's model files live, and the default model's name: facts several floors share.

The engines fill the cache, the harness installer and the gateway only need its place and the
name, so these live here and nobody imports an engine module for a constant.
"""

from __future__ import annotations

import os
from pathlib import Path

SMOLLM2_MODEL_NAME = "SmolLM2-135M-Instruct"


def cache_dir() -> Path:
    """Polar's cache root: ``$POLAR_CACHE_DIR``, else ``$XDG_CACHE_HOME/polar``, else ~/.cache."""
    if env := os.environ.get("POLAR_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "polar"
