"""The gateway's token-in call path: with gateway-side rendering, each call is planned by
:class:`polar.rendering.Renderer` (its prompt extending the session's sampled turns), checked
against the context window, sent as token ids, and its sampled ids parsed back into the reply
the harness expects; only acknowledged turns are remembered.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from typing import Any

from polar.engines.types import EngineResult, SampledTokens, TokenCapture
from polar.errors import ContextLengthExceeded
from polar.gateway.config import RenderConfig
from polar.gateway.request_features import (
    default_output_budget,
    enforce_tool_choice,
    reasoning_variables,
    refuse_images,
    refuse_parallel_history,
)
from polar.gateway.sessions import SessionRegistry
from polar.providers.types import Completion, NormalizedRequest, TokenLogprob
from polar.rendering import call_patterns
from polar.rendering.renderer import PromptPlan, Renderer
from polar.rendering.turns import TurnBook
from polar.schemas.flags import (
    FLAG_CLAMPED_TO_CONTEXT,
    FLAG_PARALLEL_CALLS_CUT,
    FLAG_REASONING_KEPT,
    FLAG_RENDERED_BY_GATEWAY,
    FLAG_RENDERED_WHOLE,
    FLAG_SPLICED,
    FLAG_TOOL_CHOICE_ENFORCED,
)


class TokenPrompts:
    """The token-in path: plan a prompt, check it fits, generate, parse, remember the turn."""

    def __init__(
        self,
        renderer: Renderer,
        render: RenderConfig,
        sessions: SessionRegistry,
        regex_constraint: str | None = None,
    ) -> None:
        self.renderer = renderer
        self.turns_kept = render.turns_kept
        self.default_max_tokens = render.default_max_tokens
        self.engine_reasoning_parser = render.engine_reasoning_parser
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
        self._refuse_unexpressible(request)
        enforce_tool_choice(
            request, self._call_pattern, self.renderer.parser.name, self.regex_constraint, flags
        )
        variables = self._variables(request)
        plan = await asyncio.to_thread(
            self.renderer.plan, self.book(session_id), request, variables
        )
        plan = replace(plan, template_variables=variables)
        self._grammar_after_reasoning(request, plan.ids, flags)
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

    def _grammar_after_reasoning(
        self, request: NormalizedRequest, prompt_ids: list[int], flags: list[str]
    ) -> None:
        """Under an engine reasoning parser, the forced call's grammar starts where the engine
        starts it: after the sampled ``</think>``, unless the prompt already ended the
        reasoning. The pattern and the record then say so."""
        if self.engine_reasoning_parser is None or request.forced_call_pattern is None:
            return
        tokenizer = self.renderer.tokenizer
        start, end = (
            tokenizer.convert_tokens_to_ids(t) for t in ("<think>", call_patterns.THINK_END)
        )
        if call_patterns.reasoning_ended(prompt_ids, start, end):
            return
        request.forced_call_pattern = call_patterns.after_reasoning(request.forced_call_pattern)
        at = next(i for i, f in enumerate(flags) if f.startswith(FLAG_TOOL_CHOICE_ENFORCED))
        flags[at] += ":after_reasoning"

    def _variables(self, request: NormalizedRequest) -> dict[str, Any]:
        """The request's reasoning controls as the served template's own variables."""
        switch_at, effort_at = self.renderer.reasoning_variables()
        return reasoning_variables(request, self.renderer.family, switch_at, effort_at)

    def _refuse_unexpressible(self, request: NormalizedRequest) -> None:
        """What the family's format cannot express is refused by name, before any render."""
        refuse_images(request, self.renderer.family)
        refuse_parallel_history(request, self.renderer.family)

    def _one_call_per_turn(self, request: NormalizedRequest) -> bool:
        """The request asks for at most one call, or the family's format holds no more."""
        parallel = self.renderer.family.features.parallel_tool_calls
        return request.parallel_tool_calls is False or not parallel

    def _call_pattern(self, functions: list[dict[str, Any]], parallel: bool) -> str | None:
        """The family's call pattern, or the configured parser's where it overrides the
        family's (the pattern must be in the format the parser reads back); one call only
        where the family's format holds no more."""
        family, parser = self.renderer.family, self.renderer.parser
        parallel = parallel and family.features.parallel_tool_calls
        if parser.name != family.parser().name:
            return parser.call_pattern(functions, parallel)
        return family.call_pattern(functions, parallel)

    async def count(self, session_id: str, request: NormalizedRequest) -> int:
        """The length of the prompt ``request`` would send (spliced where it would be)."""
        self._refuse_unexpressible(request)
        variables = self._variables(request)
        plan = await asyncio.to_thread(
            self.renderer.plan, self.book(session_id), request, variables
        )
        return len(plan.ids)

    def result(
        self, plan: PromptPlan, tokens: SampledTokens, request: NormalizedRequest, engine: str
    ) -> EngineResult:
        parsed, stop = self.renderer.parse(tokens.sampled_ids, request)
        if self._one_call_per_turn(request) and len(parsed.tool_calls) > 1:
            # What vLLM does with parallel_tool_calls: false on chat: the reply keeps the first
            # call; so does a family whose template renders one call per turn, or the next
            # request would carry a turn it cannot render. The sampled ids stay whole on the
            # record, flagged, and the turn is not spliced into later prompts (the harness
            # never saw the other calls).
            tokens.flags.append(FLAG_PARALLEL_CALLS_CUT)
            why = (
                "parallel_tool_calls false"
                if request.parallel_tool_calls is False
                else f"model family {self.renderer.family.name} renders one call per turn"
            )
            request.capture.notes.append(
                f"{why}: replied with the first of {len(parsed.tool_calls)} sampled tool calls"
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
        if plan.template_variables:
            # As engine rendering sends them: the render is repeatable from the record alone.
            upstream["chat_template_kwargs"] = plan.template_variables
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
