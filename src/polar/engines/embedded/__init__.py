"""The embedded CPU engine: a real small model served in process, token-faithful by construction.

:class:`EmbeddedEngineCore` owns the model and its scheduler; :func:`create_app` puts the
OpenAI-compatible, vLLM-shaped HTTP face on it (on a port, or in process through
``httpx.ASGITransport``). See docs/engines.md.

The names below load on first use: importing this package (or its torch-free ``options``) must
not import torch, or every ``polar`` command (the gateway's too) would pay for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from polar.extras import require

if TYPE_CHECKING:
    from polar.engines.embedded.core import EmbeddedEngineCore
    from polar.engines.embedded.loader import LoadedModel, load_model
    from polar.engines.embedded.results import ChoiceResult, GenerationResult
    from polar.engines.embedded.sampling import GenerationParams
    from polar.engines.embedded.server import create_app

_HOMES = {
    "ChoiceResult": "results",
    "EmbeddedEngineCore": "core",
    "GenerationResult": "results",
    "LoadedModel": "loader",
    "load_model": "loader",
    "GenerationParams": "sampling",
    "create_app": "server",
}

__all__ = [
    "ChoiceResult",
    "EmbeddedEngineCore",
    "GenerationParams",
    "GenerationResult",
    "LoadedModel",
    "create_app",
    "load_model",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    require("embedded", "the embedded engine")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
