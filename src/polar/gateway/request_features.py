"""Request features a chat endpoint handles itself, decided for the token-in path.

With gateway rendering the engine sees token ids, not a chat request: what vLLM's chat
endpoint would do with ``tool_choice``, images, reasoning controls and a missing output budget
is the gateway's to do, or to refuse by name in the caller's own error shape. What the served
family's format can express (its :class:`~polar.rendering.families.base.Features` and the
template variables its template reads) decides the rest: images, whether one assistant turn
may hold several calls, and whether reasoning has a switch and an effort control. Under engine
rendering the reasoning controls travel as the engine's own chat fields. Nothing is dropped
silently: each control is on the record, by the client's name, with what became of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from polar.errors import InvalidRequest
from polar.providers.types import ENGINE_THINKING_SWITCH, NormalizedRequest
from polar.rendering.call_patterns import forced_tools
from polar.rendering.families.base import Family
from polar.schemas.flags import FLAG_MAX_TOKENS_DEFAULTED, FLAG_TOOL_CHOICE_ENFORCED


def forced_choice(request: NormalizedRequest) -> str | None:
    """``required`` or ``named`` when the request forces a tool call, else None."""
    if not request.tools:
        return None
    if request.tool_choice == "required":
        return "required"
    return "named" if isinstance(request.tool_choice, dict) else None


CallPattern = Callable[[list[dict[str, Any]], bool], str | None]


def enforce_tool_choice(
    request: NormalizedRequest,
    call_pattern: CallPattern,
    call_format: str,
    constraint: str | None,
    flags: list[str],
) -> None:
    """Force the call through the engine's structured output (``constraint`` names the field
    the engine takes a regex in, None when it has none), in the family's own call format
    (``call_pattern``: the family's hook, ``call_format`` its name for messages)."""
    kind = forced_choice(request)
    if kind is None:
        return
    feature = f"tool_choice {kind}"
    functions = forced_tools(request.tools, request.tool_choice)
    if request.response_format is not None:
        raise InvalidRequest(
            f"{feature} together with structured output (a response format) cannot both be "
            "enforced under gateway rendering; ask for one of them"
        )
    if constraint is None:
        raise InvalidRequest(
            f"{feature} is not supported by this engine under gateway rendering: it has no "
            "constrained decoding to force a call; serve the model with vLLM or SGLang, or "
            "send tool_choice auto"
        )
    pattern = call_pattern(functions, request.parallel_tool_calls is not False)
    if pattern is None:
        raise InvalidRequest(
            f"{feature} is not supported under gateway rendering for the {call_format!r} "
            "tool-call format (it has no call pattern to force); send tool_choice auto"
        )
    request.forced_call_pattern = pattern
    request.capture.feature(feature, "mapped")
    flags.append(f"{FLAG_TOOL_CHOICE_ENFORCED}:{constraint}")


def refuse_images(request: NormalizedRequest, family: Family) -> None:
    """The token-in path carries no pixels: an image is refused by name, never rendered as
    text the model would answer without having seen it. The family's ``images`` feature says
    what would serve it: the engine's multimodal path, or no path at all (vLLM's own 400)."""
    for at, message in enumerate(request.messages):
        content = message.get("content")
        if isinstance(content, list) and any(_is_image(part) for part in content):
            if family.features.images:
                why = (
                    "the token prompt cannot carry pixels; serve this multimodal model "
                    f"({family.name}) with render: engine"
                )
            else:
                why = f"model family {family.name} is not a multimodal model"
            refused = f"images are not supported under gateway rendering (messages[{at}] has one)"
            raise InvalidRequest(f"{refused}: {why}")


def refuse_parallel_history(request: NormalizedRequest, family: Family) -> None:
    """A family whose template renders one call per assistant turn (Llama 3 raises on more,
    gpt-oss renders the first and drops the rest) is never handed a turn with several: the
    request is refused by name instead of failing in, or silently passing, the template."""
    if family.features.parallel_tool_calls:
        return
    for at, message in enumerate(request.messages):
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if isinstance(calls, list) and len(calls) > 1:
            raise InvalidRequest(
                f"messages[{at}] is an assistant turn with {len(calls)} tool calls, but model "
                f"family {family.name} renders one tool call per assistant turn (parallel tool "
                "calls are not expressible in its format): send each call in a turn of its own"
            )


def _is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in ("image_url", "input_image", "image")


def default_output_budget(request: NormalizedRequest, budget: int, flags: list[str]) -> None:
    """An output budget where neither the request, the sampling policy nor a context window set
    one: vLLM's ``/v1/completions`` would otherwise stop every reply at 16 tokens."""
    if request.params.max_tokens is None:
        request.params.max_tokens = budget
        flags.append(f"{FLAG_MAX_TOKENS_DEFAULTED}:{budget}")


def reasoning_variables(
    request: NormalizedRequest, family: Family, switch_at: str | None, effort_at: str | None
) -> dict[str, Any]:
    """Gateway rendering: the template variables for the reasoning switch and effort the
    client asked (``switch_at``, ``effort_at``: the variables the served template reads, None
    where it has none), each control on the record with what became of it."""
    variables: dict[str, Any] = {}
    switch, effort = request.reasoning.switch, request.reasoning.effort
    if switch is not None:
        state = "on" if switch.on else "off"
        if switch_at is not None:
            variables[switch_at] = switch.on
            note = f"{switch_at}={str(switch.on).lower()} in the chat template"
        elif not family.features.reasoning:
            note = f"model family {family.name} does not reason: there is nothing to switch {state}"
        else:
            note = (
                f"model family {family.name}'s template has no reasoning switch: it reasons as "
                "its template always has it"
            )
        _mapped(request, switch.feature, note)
    if effort is not None:
        if effort_at is not None:
            variables[effort_at] = effort.level
            note = f"{effort_at}={effort.level} in the chat template"
        else:
            note = f"model family {family.name}'s template has no effort control: not applied"
        _mapped(request, effort.feature, f"{effort.asked}: {note}")
    return variables


def reasoning_for_engine(request: NormalizedRequest) -> None:
    """Engine rendering: the controls travel as the engine's chat fields
    (:meth:`NormalizedRequest.engine_reasoning_fields`); on the record, by name."""
    switch, effort = request.reasoning.switch, request.reasoning.effort
    if switch is not None:
        value = str(switch.on).lower()
        _mapped(
            request,
            switch.feature,
            f"sent to the engine as chat_template_kwargs.{ENGINE_THINKING_SWITCH}={value} "
            "(applied where the engine's chat template reads that switch)",
        )
    if effort is not None:
        _mapped(
            request,
            effort.feature,
            f"{effort.asked}: sent to the engine as reasoning_effort={effort.level}",
        )


def _mapped(request: NormalizedRequest, feature: str, note: str) -> None:
    request.capture.feature(feature, "mapped")
    request.capture.notes.append(f"{feature}: {note}")
