"""The embedded engine as the gateway calls it: in-process, over the vLLM-shaped HTTP API."""

from __future__ import annotations

from typing import Any, ClassVar

import httpx

from polar.engines.embedded.core import EmbeddedEngineCore
from polar.engines.embedded.server import create_app
from polar.engines.vllm import VLLMEngine
from polar.providers.types import NormalizedRequest


class EmbeddedEngine(VLLMEngine):
    """Holds the :class:`EmbeddedEngineCore` (and so the one model object) it serves.

    The request goes through the same ASGI app ``polar serve-engine`` exposes, so the gateway
    parses exactly what a remote vLLM would send; only the socket is missing.
    """

    name: ClassVar[str] = "embedded"
    regex_constraint: ClassVar[str | None] = None  # no constrained decoding (see server.py)

    def __init__(
        self,
        core: EmbeddedEngineCore,
        *,
        timeout_s: float = 600.0,
        extra_body: dict[str, Any] | None = None,
    ):
        self.core = core
        transport = httpx.ASGITransport(app=create_app(core))
        super().__init__(
            "http://embedded-engine",
            transport=transport,
            timeout_s=timeout_s,
            extra_body=extra_body,
        )

    def build_body(self, request: NormalizedRequest) -> dict[str, Any]:
        body = super().build_body(request)
        body["model"] = self.core.model_name  # it serves one model, whatever the harness named
        return body

    def build_token_body(self, prompt_ids: list[int], request: NormalizedRequest) -> dict[str, Any]:
        body = super().build_token_body(prompt_ids, request)
        body["model"] = self.core.model_name
        return body

    def local_tokenizer(self) -> Any:
        return self.core.tokenizer

    @classmethod
    def from_options(
        cls,
        options: dict[str, Any],
        *,
        timeout_s: float = 600.0,
        extra_body: dict[str, Any] | None = None,
    ) -> EmbeddedEngine:
        """Options: ``model`` (smollm2, tiny, an HF dir or a .gguf), ``dtype``, and core options."""
        options = dict(options)
        source = str(options.pop("model", "smollm2"))
        dtype = str(options.pop("dtype", "float32"))
        core = EmbeddedEngineCore.from_source(source, dtype=dtype, **options)
        return cls(core, timeout_s=timeout_s, extra_body=extra_body)
