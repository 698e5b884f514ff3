"""What the gateway learns from its engine at start: the served model, its context window, and
the renderer for its family and tokenizer.

At start (and lazily, for gateways built without a lifespan) the gateway asks the engine what
it serves (``/v1/models``: model name, ``max_model_len``), so a harness's own model name and a
missing ``context_window`` need no YAML, and a wrong engine URL is reported at once in words.
The renderer (family detected or configured, tokenizer found or named) is what gateway-side
rendering (:mod:`polar.gateway.token_prompts`) plans each call with.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar.engines.base import Engine
from polar.engines.types import ModelInfo
from polar.errors import ConfigError, EngineTimeout, EngineUnavailable, GatewayError
from polar.extras import MissingExtra, require
from polar.gateway.config import GatewayConfig, RenderConfig
from polar.providers.types import NormalizedRequest
from polar.rendering.families.base import Family
from polar.rendering.renderer import Renderer
from polar.schemas.model_files import SMOLLM2_MODEL_NAME

log = logging.getLogger("polar.gateway")


@dataclass
class EngineFacts:
    """The served model, its context window and the renderer, as resolved at start."""

    served_model: str | None
    context_window: int | None
    renderer: Renderer | None
    notes: list[str] = field(default_factory=list)

    @property
    def render_mode(self) -> str:
        return "gateway" if self.renderer is not None else "engine"


async def discover(config: GatewayConfig, engine: Engine) -> EngineFacts:
    """Ask the engine what it serves; build the renderer the config asks for."""
    info = await _model_info(engine)
    served = config.served_model or (info.name if info else None)
    window = config.context_window or (info.max_model_len if info else None)
    notes = []
    if info is not None and config.served_model and config.served_model != info.name:
        notes.append(
            f"served_model {config.served_model!r} differs from the engine's {info.name!r}"
        )
    unrendered = "no tokenizer known for the served model (set render.tokenizer)"
    try:
        renderer = await asyncio.to_thread(_renderer, config.render, engine, info)
    except UnknownFamily as exc:
        renderer, unrendered = None, str(exc)
    except MissingExtra as exc:
        if config.render.mode != "auto" or config.render.tokenizer:
            raise  # asked for by name: fail the start
        renderer, unrendered = None, str(exc)
    if renderer is not None:
        log.info(
            "render: gateway, model family %s (%s), tool parser %s, turn ends %s, "
            "reasoning_history %s",
            renderer.family.name,
            "from render.family" if config.render.family else "detected",
            renderer.parser.name,
            " ".join(renderer.turn_ends.values()),
            renderer.reasoning_history,
        )
    if renderer is None and window is not None and not await _can_count(engine, served):
        notes.append(
            "the engine has no working /tokenize: prompts are not checked against the context "
            "window before the engine sees them; set render.tokenizer to render in the gateway"
        )
        window = None
    if renderer is None and config.render.mode == "auto":
        notes.append(
            f"render: auto renders prompts in the engine: {unrendered}; merged traces split "
            "wherever the engine's re-rendering differs from what was sampled"
        )
    for note in notes:
        log.warning(note)
    return EngineFacts(served, window, renderer, notes)


def require_render_extra(render: RenderConfig) -> None:
    """A gateway told to render itself (or given a tokenizer) without transformers installed
    fails at start, not at its first call, whether or not the engine is up yet."""
    if render.mode == "gateway":
        require("render", "render: gateway")
    if render.mode == "auto" and render.tokenizer:
        require("render", "render.tokenizer")


async def _model_info(engine: Engine) -> ModelInfo | None:
    url = str(getattr(engine, "base_url", ""))
    if url.rstrip("/").endswith("/v1"):
        raise ConfigError(f"the engine URL {url} ends in /v1: give the server root instead")
    try:
        return await engine.model_info()
    except (EngineUnavailable, EngineTimeout):
        raise  # the engine is down (or not up yet): the caller gets a 503, nothing is cached
    except GatewayError as exc:
        raise ConfigError(f"cannot read the engine's model list (/v1/models): {exc}") from exc


async def _can_count(engine: Engine, model: str | None) -> bool:
    probe = NormalizedRequest(
        provider="openai_chat", model=model or "", messages=[{"role": "user", "content": "hi"}]
    )
    try:
        await engine.count_tokens(probe)
    except (EngineUnavailable, EngineTimeout):
        return True  # not up yet: that is no proof /tokenize is missing
    except GatewayError:
        return False
    return True


class UnknownFamily(ConfigError):
    """No family recognises the served model's tokenizer and the config names none."""


def _renderer(render: RenderConfig, engine: Engine, info: ModelInfo | None) -> Renderer | None:
    if render.mode == "engine":
        return None
    tokenizer = _tokenizer(render, engine, info)
    if tokenizer is None:
        if render.mode == "gateway":
            raise ConfigError(
                "render: gateway needs the served model's tokenizer: set render.tokenizer to "
                "its HF directory, .gguf file or hub id"
            )
        return None
    from polar.rendering.chat_template import bundled_template
    from polar.rendering.parsers.registry import get_tool_parser

    family = _family(render, tokenizer)
    template = None
    if render.chat_template:
        path = Path(render.chat_template)
        template = path.read_text("utf-8") if path.is_file() else bundled_template(path.stem)
    return Renderer(
        tokenizer,
        family,
        chat_template=template,
        parser=get_tool_parser(render.tool_parser) if render.tool_parser else None,
        turn_ends=tuple(render.eot_token) if render.eot_token else None,
        reasoning_history=render.reasoning_history,
    )


def _family(render: RenderConfig, tokenizer: Any) -> Family:
    """The configured family, else the detected one, else (a parser named) the tokenizer's."""
    from polar.rendering.families.registry import FAMILIES, detect_family, get_family

    if render.family:
        return get_family(render.family)
    family = detect_family(tokenizer)
    if family is not None:
        return family
    if render.tool_parser:
        return get_family("tokenizer")
    known = ", ".join(FAMILIES.names())
    if render.mode == "gateway":
        raise ConfigError(
            "render: gateway: the served model's family is not known from its tokenizer, so "
            f"its tool calls cannot be parsed; set render.family ({known}, or module:Class) or "
            "render.tool_parser"
        )
    raise UnknownFamily(
        f"no model family recognises the served model's tokenizer (known: {known}; set "
        "render.family or render.tool_parser)"
    )


def _tokenizer(render: RenderConfig, engine: Engine, info: ModelInfo | None) -> Any:
    from polar.rendering.model_files import load_tokenizer

    if render.tokenizer:
        if Path(render.tokenizer).exists():
            return load_tokenizer(render.tokenizer)
        require("render", "render.tokenizer")
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(render.tokenizer)
    local = engine.local_tokenizer()
    if local is not None:
        return local
    if info is not None and info.root and (Path(info.root) / "tokenizer_config.json").is_file():
        return load_tokenizer(info.root)
    if info is not None and info.name == SMOLLM2_MODEL_NAME:
        return load_tokenizer()
    return None
