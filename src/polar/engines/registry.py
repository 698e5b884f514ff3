"""Engines by name (or ``module:Class``), built from one :class:`EngineConfig`."""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from polar.engines.base import Engine
from polar.engines.pool import EnginePool, RecallReplica, Replica
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
    replicas: list[str | EngineConfig] = Field(
        default_factory=list,
        description="Several engines as one pool (session-affine): URLs of this kind, or whole "
        "engine configs. Replaces base_url.",
    )
    router: Literal["vllm-router", "sglang-router"] | None = Field(
        None,
        description="base_url is this external router: each call carries its session's routing "
        "key in the router's own header (X-Session-ID, X-SMG-Routing-Key).",
    )
    health_interval_s: float = Field(
        5.0, gt=0, description="How often a pool probes its replicas (GET /v1/models)."
    )

    @model_validator(mode="after")
    def _one_way_to_reach(self) -> EngineConfig:
        if self.replicas and self.base_url:
            raise ValueError("give base_url or replicas, not both")
        if self.replicas and self.router:
            raise ValueError("router routes by itself: give its base_url, not replicas")
        return self


# The header each router reads a session's affinity key from (vllm-router's consistent_hash
# policy; sglang-router's manual policy: its 0.3.2 CLI offers no consistent_hashing).
ROUTER_HEADERS = {"vllm-router": "X-Session-ID", "sglang-router": "X-SMG-Routing-Key"}


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
            routing_header=ROUTER_HEADERS[config.router] if config.router else None,
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


def create_engine(config: EngineConfig, recall: RecallReplica | None = None) -> Engine:
    """The engine ``config`` names (a pool when it lists replicas; ``recall`` tells the pool
    where a session ran before a restart); ``module:Class`` kinds receive the config object."""
    if not config.replicas:
        return ENGINES.get(config.kind)(config)
    replicas = []
    for i, entry in enumerate(config.replicas):
        one = entry if isinstance(entry, EngineConfig) else _replica_config(config, entry)
        name = urlsplit(one.base_url).netloc if one.base_url else f"r{i}"
        replicas.append(Replica(name, ENGINES.get(one.kind)(one)))
    return EnginePool(replicas, recall=recall, health_interval_s=config.health_interval_s)


def _replica_config(pool: EngineConfig, url: str) -> EngineConfig:
    return pool.model_copy(update={"base_url": url, "replicas": []})
