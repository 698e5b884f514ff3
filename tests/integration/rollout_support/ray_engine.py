"""The scripted conversation engine as an ``engine.kind`` (``module:function``), so gateway
actors in Ray worker processes build it from config like any engine (``PYTHONPATH`` must
reach ``tests/``). ``options.latency_s`` delays every call."""

from __future__ import annotations

from polar.engines.base import Engine
from polar.engines.registry import EngineConfig
from polar.engines.scripted import Script, ScriptedBackend
from polar.rendering.model_files import load_tokenizer

from .cluster import ConversationEngine


def conversation_engine(config: EngineConfig) -> Engine:
    backend = ScriptedBackend(Script(), tokenizer=load_tokenizer())
    return ConversationEngine(backend, float(config.options.get("latency_s", 0.0)))
