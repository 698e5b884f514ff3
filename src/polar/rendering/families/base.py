"""What a model family declares, so one rendering path serves every family faithfully.

A :class:`Family` says where its chat template comes from and how it renders (Jinja after vLLM's
chat preprocessing by default; a family may render with its own encoder instead), which parser
reads its sampled turns, which tokens end a sampled turn and what history writes in their place,
which special tokens its parser must see, whether spliced prompts keep past reasoning that its
template would drop, which request features it supports, how to recognise its tokenizer, and the
regex that forces a call in its own call format (``tool_choice``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Literal

from polar.rendering.chat_template import bundled_template, render_text
from polar.rendering.parsers.base import ToolParser
from polar.rendering.parsers.registry import get_tool_parser

ReasoningHistory = Literal["keep", "drop"]
# strftime_now with a literal format: ('%Y-%m-%d') or ("%d %b %Y").
_CLOCK_CALL = re.compile(r"""strftime_now\(\s*(["'])(?P<fmt>[^"'\\]*)\1\s*\)""")


@dataclass(frozen=True)
class Features:
    """Request features a family's format can express (anything else is refused by name)."""

    parallel_tool_calls: bool = True
    reasoning: bool = False
    images: bool = False


class Family:
    """One model family; stateless, so one instance serves every call.

    Subclasses set the class attributes; the methods have defaults that fit Jinja families.
    """

    name: ClassVar[str]
    # A tool parser name (or module:Class) in polar.rendering.parsers.registry.
    tool_parser: ClassVar[str]
    # Tokens the model samples to end its turn; () means the tokenizer's eos token.
    turn_ends: ClassVar[tuple[str, ...]] = ()
    # A sampled turn end -> the text the template writes in its place when the turn is history
    # (gpt-oss samples <|return|>, history closes with <|end|>); absent: the same token.
    history_ends: ClassVar[dict[str, str]] = {}
    # Closing texts that may also appear inside one rendered turn (gpt-oss closes each channel
    # of a call turn with <|end|>): finding one before the turn's own close is no error.
    inner_closes: ClassVar[tuple[str, ...]] = ()
    # Special tokens the parser must see in the decoded text; every other special token is
    # decoded to "" (eos, padding, the turn end).
    parse_specials: ClassVar[tuple[str, ...]] = ()
    # keep: a spliced prompt carries past reasoning as sampled; drop: where the template would
    # drop it (a new user turn after a turn with reasoning), the prompt is rendered whole.
    reasoning_history: ClassVar[ReasoningHistory] = "keep"
    features: ClassVar[Features] = Features()
    # A template Polar ships (rendering/templates/<name>.jinja) used instead of the tokenizer's.
    bundled: ClassVar[str | None] = None
    # The parser's call ids are the model's own (Kimi functions.NAME:IDX): replies and history
    # keep them instead of fresh call_ ids.
    model_call_ids: ClassVar[bool] = False
    # The template variables that switch reasoning on or off (Qwen3, Qwen3.5, GLM, Nemotron 3)
    # and set its effort (gpt-oss: low, medium, high); a template has one where it reads it.
    thinking_switch: ClassVar[str] = "enable_thinking"
    effort_control: ClassVar[str] = "reasoning_effort"

    def matches(self, tokenizer: Any) -> bool:
        """Whether ``tokenizer`` (its chat template and special tokens) is this family's."""
        return False

    def chat_template(self, tokenizer: Any) -> str | None:
        """The template to render with: Polar's bundled one, else the tokenizer's own."""
        if self.bundled is not None:
            return bundled_template(self.bundled)
        template = getattr(tokenizer, "chat_template", None)
        return template if isinstance(template, str) else None

    def render(
        self,
        tokenizer: Any,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        chat_template: str | None,
        add_generation_prompt: bool = True,
        continue_final: bool = False,
        started: datetime | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text vLLM's chat endpoint would feed the model (override: an encoder);
        ``started`` (the session's start) is the date a template prints (:func:`dated`);
        ``variables`` are the request's own template variables (:meth:`reasoning_variables`)."""
        template = dated(chat_template or tokenizer.chat_template, started)
        tools, extra = self.template_inputs(tools, template)
        extra = {**extra, **(variables or {})}
        return render_text(
            tokenizer,
            messages,
            tools,
            add_generation_prompt=add_generation_prompt,
            chat_template=template,
            continue_final=continue_final,
            template_kwargs=extra,
        )

    def template_inputs(
        self, tools: list[dict[str, Any]] | None, template: str | None
    ) -> tuple[list[dict[str, Any]] | None, dict[str, Any]]:
        """The tools and extra template variables the family's own tokenizer code hands its
        template (Kimi: key-sorted tools and ``tools_ts_str``); default: the tools, nothing."""
        return tools, {}

    def reasoning_variables(self, template: str | None) -> tuple[str | None, str | None]:
        """The reasoning switch and effort variables ``template`` reads (None: it has none);
        a family that renders with its own encoder has neither (no template to read them)."""
        text = template or ""
        switch = self.thinking_switch if self.thinking_switch in text else None
        effort = self.effort_control if self.effort_control in text else None
        return switch, effort

    def parser(self) -> ToolParser:
        return get_tool_parser(self.tool_parser)

    def call_pattern(self, functions: list[dict[str, Any]], parallel: bool) -> str | None:
        """A regex over the sampled text that forces a call to one of ``functions`` (already
        cut to what ``tool_choice`` allows) in this family's own format; None: it cannot."""
        return self.parser().call_pattern(functions, parallel)

    def turn_end_tokens(self, tokenizer: Any) -> tuple[str, ...]:
        if self.turn_ends:
            return self.turn_ends
        eos = getattr(tokenizer, "eos_token", None)
        return (str(eos),) if eos else ()

    def history_end(self, sampled_end: str) -> str:
        """What history writes where the model sampled ``sampled_end``."""
        return self.history_ends.get(sampled_end, sampled_end)


def dated(template: str | None, started: datetime | None) -> str | None:
    """``template`` with each ``strftime_now("FMT")`` (transformers' wall clock, for templates
    that print today's date: gpt-oss, Llama 3.2) replaced by ``started`` in that format, so
    every render of one session prints the date it started. transformers hands templates no
    callables, hence the rewrite; a call with a computed format keeps the wall clock."""
    if template is None or started is None or "strftime_now" not in template:
        return template
    return _CLOCK_CALL.sub(lambda m: json.dumps(started.strftime(m["fmt"] or "")), template)


def has_special(tokenizer: Any, *tokens: str) -> bool:
    """Whether every one of ``tokens`` is a single token of ``tokenizer``'s vocabulary."""
    vocab = tokenizer.get_vocab()
    return all(t in vocab for t in tokens)


def template_has(tokenizer: Any, *snippets: str) -> bool:
    """Whether the tokenizer's own chat template contains every one of ``snippets``."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and all(s in template for s in snippets)


class TokenizerFamily(Family):
    """A model no family recognises, served by name of its parser (``render.tool_parser``):
    the tokenizer's own template, its eos token as the turn end."""

    name = "tokenizer"
    tool_parser = "hermes"
