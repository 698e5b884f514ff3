"""Reading each API's reasoning fields into :class:`~polar.providers.types.ReasoningControls`.

The APIs name the same few controls differently: a switch (Anthropic ``thinking`` enabled /
adaptive / disabled, OpenAI effort ``none``, Gemini ``thinkingBudget: 0``), an effort word
(Anthropic ``output_config.effort``, OpenAI ``reasoning.effort`` / ``reasoning_effort``, Gemini
``thinkingLevel``) and a token budget, which no engine here takes: a budget is put on the record
by name, as mapped to nothing.
"""

from __future__ import annotations

from polar.errors import InvalidRequest
from polar.providers.types import (
    CaptureTags,
    EffortLevel,
    ReasoningControls,
    ReasoningEffort,
    ReasoningSwitch,
)

# Every API's effort words on the three levels a template's effort control takes.
_LEVELS: dict[str, EffortLevel] = {
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}
OPENAI_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
ANTHROPIC_EFFORTS = ("low", "medium", "high", "xhigh", "max")


def effort_word(value: object, feature: str, allowed: tuple[str, ...]) -> str | None:
    """The client's effort word, checked against its API's own words (None: not given)."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in allowed:
        raise InvalidRequest(f"{feature} must be one of {', '.join(allowed)}")
    return value


def openai_effort(value: object, feature: str) -> ReasoningControls:
    """OpenAI's ``reasoning.effort`` / ``reasoning_effort``: ``none`` switches reasoning off,
    any other word is an effort level."""
    word = effort_word(value, feature, OPENAI_EFFORTS)
    if word is None:
        return ReasoningControls()
    if word == "none":
        return ReasoningControls(switch=ReasoningSwitch(f"{feature} none", on=False))
    return ReasoningControls(effort=effort(feature, word))


def effort(feature: str, word: str) -> ReasoningEffort:
    return ReasoningEffort(feature, word, _LEVELS[word])


def record_budget(capture: CaptureTags, feature: str, tokens: int) -> None:
    """A thinking budget: no engine here caps reasoning tokens apart from the output budget, so
    it is mapped to nothing, by name, on the record."""
    capture.feature(feature, "mapped")
    capture.notes.append(
        f"{feature} {tokens}: no engine here takes a thinking budget; the model reasons within "
        "the output token limit"
    )
