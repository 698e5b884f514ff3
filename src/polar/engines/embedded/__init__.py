"""The embedded CPU engine: a real small model served in process, token-faithful by construction.

:class:`EmbeddedEngineCore` owns the model and its scheduler; :func:`create_app` puts the
OpenAI-compatible, vLLM-shaped HTTP face on it (on a port, or in process through
``httpx.ASGITransport``). See docs/engines.md.

The names below load on first use: importing this package (or its torch-free ``options``) must
not import torch, or every ``polar`` command (the gateway's too) would pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from polar import load_lazily
from polar.extras import require

if TYPE_CHECKING:
    from polar.engines.embedded.core import EmbeddedEngineCore
    from polar.engines.embedded.loader import LoadedModel, load_model
    from polar.engines.embedded.results import ChoiceResult, GenerationResult
    from polar.engines.embedded.sampling import GenerationParams
    from polar.engines.embedded.server import create_app

_HOMES = {
    "ChoiceResult": "polar.engines.embedded.results",
    "EmbeddedEngineCore": "polar.engines.embedded.core",
    "GenerationResult": "polar.engines.embedded.results",
    "LoadedModel": "polar.engines.embedded.loader",
    "load_model": "polar.engines.embedded.loader",
    "GenerationParams": "polar.engines.embedded.sampling",
    "create_app": "polar.engines.embedded.server",
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
    if name in _HOMES:
        require("embedded", "the embedded engine")
    return load_lazily(globals(), _HOMES, name)
