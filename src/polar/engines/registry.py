"""Engines by name (or ``module:Class``), built from one :class:`EngineConfig`."""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from polar.engines.base import Engine
from polar.engines.scripted import ScriptedEngine
from polar.engines.sglang import SGLangEngine
from polar.engines.vllm import VLLMEngine
from polar.errors import ConfigError
from polar.extras import require
from polar.registry import Registry


class EngineConfig(BaseModel):
    """Which engine a gateway calls and how."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field("scripted", description="vllm, sglang, embedded, scripted, or module:Class.")
    base_url: str | None = Field(None, description="Server URL for vllm/sglang (without /v1).")
    api_key: str | None = None
    timeout_s: float = Field(600.0, gt=0)
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="Fields added to every engine request."
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Kind-specific options (e.g. the embedded model path)."
    )


def _http(cls: type[VLLMEngine] | type[SGLangEngine]) -> Any:
    def build(config: EngineConfig, transport: httpx.AsyncBaseTransport | None = None) -> Engine:
        if not config.base_url and transport is None:
            raise ConfigError(f"engine kind {config.kind!r} needs base_url")
        return cls(
            config.base_url or "http://engine",
            api_key=config.api_key,
            timeout_s=config.timeout_s,
            transport=transport,
            extra_body=config.extra_body,
        )

    return build


def _embedded(config: EngineConfig, transport: httpx.AsyncBaseTransport | None = None) -> Engine:
    # Imported here: loading torch and transformers costs seconds that HTTP engines never need.
    require("embedded", "the embedded engine")
    from polar.engines.embedded.client import EmbeddedEngine

    return EmbeddedEngine.from_options(
        config.options, timeout_s=config.timeout_s, extra_body=config.extra_body
    )


def _scripted(config: EngineConfig, transport: httpx.AsyncBaseTransport | None = None) -> Engine:
    return ScriptedEngine.from_options(config.options, timeout_s=config.timeout_s)


ENGINES: Registry[Engine] = Registry("engine")
ENGINES.add("vllm", _http(VLLMEngine))
ENGINES.add("sglang", _http(SGLangEngine))
ENGINES.add("scripted", _scripted)
ENGINES.add("embedded", _embedded)


def create_engine(config: EngineConfig) -> Engine:
    """The engine ``config`` names; ``module:Class`` kinds receive the config object."""
    return ENGINES.get(config.kind)(config)
