"""The normalized request and completion every provider adapter converts to and from.

The normalized request is the chat-completions form the engines speak: ``messages`` are
OpenAI chat messages (one leading system message at most, ``tool_calls`` on assistant turns,
``role: tool`` results, past reasoning in ``reasoning``), ``tools`` are chat-completions
function tools. Adapters keep every provider quirk on their own side of this line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from polar.errors import InvalidRequest

Message = dict[str, Any]
Tool = dict[str, Any]

FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter")
# The chat-template variable that switches reasoning on or off where a template has one
# (Qwen3, Qwen3.5, GLM-4.5+, Nemotron 3): what engine rendering sends in chat_template_kwargs.
ENGINE_THINKING_SWITCH = "enable_thinking"


@dataclass
class SamplingParams:
    """Generation parameters; ``None`` means "not set" (the engine's or run's default applies)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    # Token ids that end the turn (vLLM/SGLang ``stop_token_ids``): set by the gateway on the
    # token path from the family's turn ends, so a model whose generation config lacks them
    # still stops where the family ends a turn. Clients do not set it.
    stop_token_ids: list[int] | None = None

    def __post_init__(self) -> None:
        # Checked once here so every adapter rejects impossible values with a clear 400.
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequest("the output token limit must be at least 1")
        if self.temperature is not None and self.temperature < 0:
            raise InvalidRequest("temperature must not be negative")
        if self.top_p is not None and not 0 <= self.top_p <= 1:
            raise InvalidRequest("top_p must be between 0 and 1")
        if self.top_k is not None and self.top_k < -1:
            raise InvalidRequest("top_k must be -1 (off), 0 (off) or positive")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value is not None and not -2 <= value <= 2:
                raise InvalidRequest(f"{name} must be between -2 and 2")

    def as_dict(self) -> dict[str, Any]:
        """The parameters that are set, as chat-completions body fields."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


FeatureFate = Literal["honoured", "mapped", "refused"]

# The effort levels the templates with an effort control take (gpt-oss: low, medium, high).
EffortLevel = Literal["low", "medium", "high"]


@dataclass(frozen=True)
class ReasoningSwitch:
    """Reasoning switched on or off (Anthropic ``thinking``, OpenAI effort ``none``, Gemini
    ``thinkingBudget``); ``feature`` is the client's field as the record names it."""

    feature: str
    on: bool


@dataclass(frozen=True)
class ReasoningEffort:
    """How hard the model should reason: the client's word (``asked``) on a template's three
    levels (``level``); ``feature`` names the client's field on the record."""

    feature: str
    asked: str
    level: EffortLevel


@dataclass(frozen=True)
class ReasoningControls:
    """What the client asked of the model's reasoning, whatever its API called it. Who renders
    decides what becomes of it (gateway/request_features.py): the family's own template
    variables under gateway rendering, the engine's chat fields under engine rendering."""

    switch: ReasoningSwitch | None = None
    effort: ReasoningEffort | None = None


@dataclass(frozen=True)
class ResponseFormat:
    """Structured output the client asked for, whatever its API called it: any JSON object
    (``json_object``) or JSON matching ``schema`` (``json_schema``; ``name`` and ``strict`` as
    OpenAI's ``json_schema`` carries them)."""

    kind: Literal["json_object", "json_schema"]
    schema: dict[str, Any] | None = None
    name: str = "response"
    strict: bool | None = None

    def __post_init__(self) -> None:
        if self.kind == "json_schema" and not isinstance(self.schema, dict):
            raise InvalidRequest("structured output: a json_schema format needs a schema object")

    def openai_body(self) -> dict[str, Any]:
        """Chat-completions ``response_format``, the shape vLLM and SGLang take on chat (and vLLM
        on ``/v1/completions``)."""
        if self.kind == "json_object":
            return {"type": "json_object"}
        spec: dict[str, Any] = {"name": self.name, "schema": self.schema}
        if self.strict is not None:
            spec["strict"] = self.strict
        return {"type": "json_schema", "json_schema": spec}

    def schema_or_object(self) -> dict[str, Any]:
        """The JSON schema output must match (any object for ``json_object``)."""
        return self.schema if self.schema is not None else {"type": "object"}


@dataclass
class CaptureTags:
    """What the capture record says about a call beyond the call itself.

    ``tags`` mark the call's kind (e.g. ``side_call:title``, set by the gateway); the rest is what
    the adapter dropped or rewrote: free-form ``notes``, the system-prompt lines it ``stripped``,
    and the input item types it ``ignored``.
    """

    tags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stripped: list[str] = field(default_factory=list)
    ignored_items: list[str] = field(default_factory=list)
    # Request features and what became of each: "honoured" (passed on as asked), "mapped"
    # (carried out another way, e.g. a provider option turned into an engine parameter) or
    # "refused" (answered with a 4xx naming it). A feature is never dropped silently.
    features: dict[str, FeatureFate] = field(default_factory=dict)

    def feature(self, name: str, fate: FeatureFate) -> None:
        self.features[name] = fate

    def record_notes(self) -> list[str]:
        """The adapter's changes in words, as the record stores them."""
        return (
            list(self.notes)
            + [f"stripped: {line}" for line in self.stripped]
            + [f"ignored item: {item}" for item in self.ignored_items]
            + [f"feature {name}: {fate}" for name, fate in sorted(self.features.items())]
        )


@dataclass
class NormalizedRequest:
    """One model call in chat-completions form, plus what the adapter needs to answer it."""

    provider: str
    model: str
    messages: list[Message]
    tools: list[Tool] = field(default_factory=list)
    tool_choice: Any = None
    params: SamplingParams = field(default_factory=SamplingParams)
    stream: bool = False
    dropped_tools: list[str] = field(default_factory=list)
    # The model name the client asked for (``model`` may be replaced by the served one); replies
    # echo it back.
    requested_model: str | None = None
    capture: CaptureTags = field(default_factory=CaptureTags)
    # Facts only the adapter that wrote them reads back when rendering the reply (its own typed
    # state object, e.g. whether usage was asked for); nothing else may read or write it.
    adapter_state: object = None
    # The last message is an assistant turn the model continues (Anthropic prefill): engines
    # render it open, without a generation prompt, and the reply holds only the continuation.
    continue_final: bool = False
    # False when the client allows at most one tool call per reply.
    parallel_tool_calls: bool | None = None
    # The client asked for the sampled tokens' logprobs (the completion carries them).
    logprobs: bool = False
    # Structured output (chat response_format, Responses text.format, Anthropic
    # output_config.format, Gemini responseSchema), forwarded to the engine.
    response_format: ResponseFormat | None = None
    # A regex the sampled text must match (tool_choice required/named under gateway rendering:
    # the family's own call format); only token prompts carry it, chat bodies send tool_choice.
    forced_call_pattern: str | None = None
    # The gateway session the call belongs to: an engine pool routes by it (set by the proxy).
    session_id: str | None = None
    # Call ids the adapter made up where the client sent none (Gemini's calls and results
    # answered by name): the gateway puts the model's own in their place where it knows the
    # sampled turn a call stands for (gateway/call_ids.py).
    made_up_call_ids: set[str] = field(default_factory=set)
    # The reasoning switch and effort the client asked for (see ReasoningControls).
    reasoning: ReasoningControls = field(default_factory=ReasoningControls)

    def chat_body(self) -> dict[str, Any]:
        """The chat-completions body for an engine; tool_choice only travels with tools."""
        body: dict[str, Any] = {"model": self.model, "messages": self.messages}
        if self.tools:
            body["tools"] = self.tools
            if self.tool_choice is not None:
                body["tool_choice"] = self.tool_choice
        body.update(self.params.as_dict())
        if self.response_format is not None:
            body["response_format"] = self.response_format.openai_body()
        if self.continue_final:
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        if self.parallel_tool_calls is not None and self.tools:
            body["parallel_tool_calls"] = self.parallel_tool_calls
        body.update(self.engine_reasoning_fields())
        return body

    def engine_reasoning_fields(self) -> dict[str, Any]:
        """The reasoning controls as vLLM's and SGLang's chat fields (engine rendering): the
        switch as the template variable Qwen3, GLM and Nemotron read, the effort as
        ``reasoning_effort`` (gpt-oss)."""
        fields: dict[str, Any] = {}
        if self.reasoning.switch is not None:
            fields["chat_template_kwargs"] = {ENGINE_THINKING_SWITCH: self.reasoning.switch.on}
        if self.reasoning.effort is not None:
            fields["reasoning_effort"] = self.reasoning.effort.level
        return fields


@dataclass
class TokenLogprob:
    """One sampled token as a client sees it: its text and its log-probability."""

    token: str
    logprob: float


@dataclass
class ToolCall:
    """A function call the model made; ``arguments`` is always complete JSON object text."""

    id: str
    name: str
    arguments: str


@dataclass
class Completion:
    """The engine's answer in normalized form (one choice)."""

    id: str
    model: str
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    created: int = 0
    stop_sequence: str | None = None  # the stop string that ended it, when one did
    # Each sampled token's text and logprob, when the client asked and the engine gave them.
    logprobs: list[TokenLogprob] | None = None
