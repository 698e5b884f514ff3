"""Request features a chat endpoint handles itself, decided for the token-in path.

With gateway rendering the engine sees token ids, not a chat request: what vLLM's chat
endpoint would do with ``tool_choice``, images and a missing output budget is the gateway's
to do, or to refuse by name in the caller's own error shape. Nothing is dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from polar.errors import InvalidRequest
from polar.providers.types import NormalizedRequest
from polar.rendering.call_patterns import forced_tools
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


def refuse_images(request: NormalizedRequest) -> None:
    """The token-in path carries no pixels: an image is refused by name, never rendered as
    text the model would answer without having seen it."""
    for at, message in enumerate(request.messages):
        content = message.get("content")
        if isinstance(content, list) and any(_is_image(part) for part in content):
            raise InvalidRequest(
                f"images are not supported under gateway rendering (messages[{at}] has one): "
                "the token prompt cannot carry pixels; serve a multimodal model with "
                "render: engine"
            )


def _is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in ("image_url", "input_image", "image")


def default_output_budget(request: NormalizedRequest, budget: int, flags: list[str]) -> None:
    """An output budget where neither the request, the sampling policy nor a context window set
    one: vLLM's ``/v1/completions`` would otherwise stop every reply at 16 tokens."""
    if request.params.max_tokens is None:
        request.params.max_tokens = budget
        flags.append(f"{FLAG_MAX_TOKENS_DEFAULTED}:{budget}")
