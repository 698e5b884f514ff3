"""What the gateway learns from its engine at start, and its token-in call path.

At start (and lazily, for gateways built without a lifespan) the gateway asks the engine what
it serves (``/v1/models``: model name, ``max_model_len``), so a harness's own model name and a
missing ``context_window`` need no YAML, and a wrong engine URL is reported at once in words.
With gateway-side rendering, each call is planned by :class:`polar.rendering.Renderer`, sent
as token ids, and its sampled text parsed back into the reply the harness expects.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from polar.engines.base import Engine
from polar.engines.types import EngineResult, ModelInfo, SampledTokens, TokenCapture
from polar.errors import (
    ConfigError,
    ContextLengthExceeded,
    EngineTimeout,
    EngineUnavailable,
    GatewayError,
)
from polar.extras import MissingExtra, require
from polar.gateway.config import GatewayConfig, RenderConfig
from polar.gateway.request_features import (
    default_output_budget,
    enforce_tool_choice,
    refuse_images,
)
from polar.gateway.sessions import SessionTable
from polar.providers.types import Completion, NormalizedRequest, TokenLogprob
from polar.rendering.families.base import Family
from polar.rendering.renderer import PromptPlan, Renderer
from polar.rendering.turns import TurnBook
from polar.schemas.flags import (
    FLAG_CLAMPED_TO_CONTEXT,
    FLAG_PARALLEL_CALLS_CUT,
    FLAG_REASONING_KEPT,
    FLAG_RENDERED_BY_GATEWAY,
    FLAG_RENDERED_WHOLE,
    FLAG_SPLICED,
)
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
        turn_ends=(render.eot_token,) if render.eot_token else None,
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
    from polar.engines.model_files import load_tokenizer

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


class TokenPrompts:
    """The token-in path: plan a prompt, check it fits, generate, parse, remember the turn."""

    def __init__(
        self,
        renderer: Renderer,
        render: RenderConfig,
        sessions: SessionTable,
        regex_constraint: str | None = None,
    ) -> None:
        self.renderer = renderer
        self.turns_kept = render.turns_kept
        self.default_max_tokens = render.default_max_tokens
        self.sessions = sessions
        # Where the engine takes a regex for its output (tool_choice); None: it has none.
        self.regex_constraint = regex_constraint
        self._books: dict[str, TurnBook] = {}

    def book(self, session_id: str) -> TurnBook:
        book = self._books.get(session_id)
        if book is None:
            # A new session is the moment to let go of the books of finished ones.
            for gone in [s for s in self._books if self.sessions.get(s) is None]:
                del self._books[gone]
            book = self._books[session_id] = TurnBook(self.turns_kept)
        return book

    async def plan(
        self, session_id: str, request: NormalizedRequest, window: int | None, flags: list[str]
    ) -> PromptPlan:
        refuse_images(request)
        enforce_tool_choice(
            request, self._call_pattern, self.renderer.parser.name, self.regex_constraint, flags
        )
        plan = await asyncio.to_thread(self.renderer.plan, self.book(session_id), request)
        if window is not None:
            fit_output_budget(request, len(plan.ids), window, flags)
        else:
            default_output_budget(request, self.default_max_tokens, flags)
        # The family's turn ends stop the engine even where the model's generation config
        # lacks them (else it writes past its turn); on the record with the sampling params.
        request.params.stop_token_ids = sorted(self.renderer.turn_ends)
        flags.append(FLAG_RENDERED_BY_GATEWAY)
        if plan.spliced_from is not None:
            flags.append(FLAG_SPLICED)
            if plan.keeps_dropped_reasoning:
                flags.append(FLAG_REASONING_KEPT)
        else:
            flags.append(f"{FLAG_RENDERED_WHOLE}:{plan.fresh_reason}")
        return plan

    def _call_pattern(self, functions: list[dict[str, Any]], parallel: bool) -> str | None:
        """The family's call pattern, or the configured parser's where it overrides the
        family's (the pattern must be in the format the parser reads back)."""
        family, parser = self.renderer.family, self.renderer.parser
        if parser.name != family.parser().name:
            return parser.call_pattern(functions, parallel)
        return family.call_pattern(functions, parallel)

    async def count(self, session_id: str, request: NormalizedRequest) -> int:
        """The length of the prompt ``request`` would send (spliced where it would be)."""
        refuse_images(request)
        plan = await asyncio.to_thread(self.renderer.plan, self.book(session_id), request)
        return len(plan.ids)

    def result(
        self, plan: PromptPlan, tokens: SampledTokens, request: NormalizedRequest, engine: str
    ) -> EngineResult:
        parsed, stop = self.renderer.parse(tokens.sampled_ids, request)
        if request.parallel_tool_calls is False and len(parsed.tool_calls) > 1:
            # What vLLM does with parallel_tool_calls: false on chat: the reply keeps the first
            # call. The sampled ids stay whole on the record, flagged, and the turn is not
            # spliced into later prompts (the harness never saw the other calls).
            tokens.flags.append(FLAG_PARALLEL_CALLS_CUT)
            request.capture.notes.append(
                f"parallel_tool_calls false: replied with the first of {len(parsed.tool_calls)} "
                "sampled tool calls"
            )
            parsed = replace(parsed, tool_calls=parsed.tool_calls[:1])
        # A turn cut by the budget says so even when it holds complete calls, as vLLM's
        # streamed chat does (providers: Anthropic max_tokens, Gemini MAX_TOKENS, Responses
        # incomplete), so a client can tell a truncated turn from a finished one.
        cut = tokens.finish_reason == "length"
        finish = "tool_calls" if parsed.tool_calls and not cut else tokens.finish_reason
        prompt_ids = tokens.prompt_ids if tokens.prompt_ids is not None else plan.ids
        completion = Completion(
            id=tokens.engine_id or "cmpl-" + uuid.uuid4().hex,
            model=request.model,
            content=parsed.content,
            reasoning=parsed.reasoning,
            tool_calls=parsed.tool_calls,
            finish_reason=finish,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(tokens.sampled_ids),
            created=int(time.time()),
            stop_sequence=stop,
        )
        if request.logprobs and tokens.logprobs is not None:
            completion.logprobs = [
                TokenLogprob(self.renderer.decode([token]), value)
                for token, value in zip(tokens.sampled_ids, tokens.logprobs, strict=True)
            ]
        upstream = {
            **tokens.upstream_request,
            "messages": request.messages,
            "tools": request.tools,
            "prompt_spliced_from": plan.spliced_from,
        }
        return EngineResult(
            completion=completion,
            tokens=TokenCapture(
                prompt_ids,
                tokens.sampled_ids,
                tokens.logprobs,
                list(tokens.flags),
                routed_experts=tokens.routed_experts,
            ),
            engine=engine,
            upstream_request=upstream,
            sampling=tokens.sampling,
            policy_version=tokens.policy_version,
        )

    def remember(
        self, session_id: str, plan: PromptPlan, completion_id: str, result: EngineResult
    ) -> None:
        """Only acknowledged completions are remembered: no harness can echo any other."""
        if FLAG_PARALLEL_CALLS_CUT in result.tokens.flags:
            return  # its sampled ids hold calls the reply left out: later prompts render it
        calls = [call.id for call in result.completion.tool_calls]
        book = self.book(session_id)
        self.renderer.remember(
            book,
            plan,
            completion_id,
            result.tokens.prompt_ids,  # the engine's echo, the truth (plan.ids unless flagged)
            result.tokens.sampled_ids,
            result.completion.content,
            calls,
        )
        book.add_calls(
            completion_id,
            [
                {"function": {"name": call.name, "arguments": call.arguments}}
                for call in result.completion.tool_calls
            ],
        )


def fit_output_budget(
    request: NormalizedRequest, prompt_tokens: int, window: int, flags: list[str]
) -> None:
    """Refuse a prompt that leaves no room (the provider's own context error, no engine call);
    lower an output budget that does not fit, and say so on the record."""
    if prompt_tokens >= window:
        raise ContextLengthExceeded(prompt_tokens, window)
    room = window - prompt_tokens
    asked = request.params.max_tokens
    if asked is None:
        request.params.max_tokens = room  # what the engine would grant; in the record's sampling
    elif asked > room:
        request.params.max_tokens = room
        flags += [FLAG_CLAMPED_TO_CONTEXT, f"max_tokens:{asked}->{room}"]
