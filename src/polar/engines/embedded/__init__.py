"""The embedded CPU engine: a real small model served in process, token-faithful by construction.

:class:`EmbeddedEngineCore` owns the model and its scheduler; :func:`create_app` puts the
OpenAI-compatible, vLLM-shaped HTTP face on it (on a port, or in process through
``httpx.ASGITransport``). See docs/engines.md.
"""

from polar.engines.embedded.core import ChoiceResult, EmbeddedEngineCore, GenerationResult
from polar.engines.embedded.loader import LoadedModel, load_model
from polar.engines.embedded.sampling import GenerationParams
from polar.engines.embedded.server import create_app

__all__ = [
    "ChoiceResult",
    "EmbeddedEngineCore",
    "GenerationParams",
    "GenerationResult",
    "LoadedModel",
    "create_app",
    "load_model",
]
