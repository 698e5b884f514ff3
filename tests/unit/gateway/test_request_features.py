"""What the token-in path does with tool_choice, images and a missing output budget."""

from __future__ import annotations

import re
from typing import Any

import pytest

from polar.errors import InvalidRequest
from polar.gateway.request_features import (
    default_output_budget,
    enforce_tool_choice,
    forced_choice,
    refuse_images,
)
from polar.providers.types import NormalizedRequest, ResponseFormat, SamplingParams
from polar.rendering.parsers.registry import get_tool_parser

TOOLS = [
    {"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}},
]
HERMES = get_tool_parser("hermes")
FIELD = "structured_outputs.regex"


def _request(choice: Any = None, **extra: Any) -> NormalizedRequest:
    messages = [{"role": "user", "content": "go"}]
    return NormalizedRequest("openai_chat", "m", messages, TOOLS, choice, **extra)


@pytest.mark.parametrize(
    ("choice", "kind"),
    [
        ("required", "required"),
        ({"type": "function", "function": {"name": "read"}}, "named"),
        ("auto", None),
        ("none", None),
        (None, None),
    ],
)
def test_only_required_and_named_choices_force_a_call(choice: Any, kind: str | None) -> None:
    request, flags = _request(choice), []
    enforce_tool_choice(request, HERMES.call_pattern, "hermes", FIELD, flags)
    assert forced_choice(request) == kind
    if kind is None:
        assert (request.forced_call_pattern, flags) == (None, [])
        return
    assert flags == [f"tool_choice_enforced:{FIELD}"]
    assert request.capture.features == {f"tool_choice {kind}": "mapped"}
    pattern = re.compile(str(request.forced_call_pattern))
    read = '<tool_call>\n{"name": "read", "arguments": {}}\n</tool_call>'
    assert pattern.fullmatch(read)
    assert bool(pattern.fullmatch(read.replace("read", "shell"))) == (kind == "required")


def test_parallel_tool_calls_false_forces_exactly_one_call() -> None:
    request = _request("required", parallel_tool_calls=False)
    enforce_tool_choice(request, HERMES.call_pattern, "hermes", FIELD, [])
    one = '<tool_call>{"name": "read", "arguments": {}}</tool_call>'
    assert re.fullmatch(str(request.forced_call_pattern), one)
    assert not re.fullmatch(str(request.forced_call_pattern), one + "\n" + one)


@pytest.mark.parametrize(
    ("request_extra", "call_pattern", "constraint", "words"),
    [
        ({}, HERMES.call_pattern, None, "not supported by this engine"),
        ({}, lambda functions, parallel: None, FIELD, "for the 'hermes' tool-call format"),
        (
            {"response_format": ResponseFormat("json_object")},
            HERMES.call_pattern,
            FIELD,
            "together with structured output",
        ),
    ],
)
def test_a_forced_call_that_cannot_be_enforced_is_refused_by_name(
    request_extra: dict[str, Any], call_pattern: Any, constraint: str | None, words: str
) -> None:
    request = _request("required", **request_extra)
    with pytest.raises(InvalidRequest, match="tool_choice required") as refused:
        enforce_tool_choice(request, call_pattern, "hermes", constraint, [])
    assert words in str(refused.value)
    assert request.forced_call_pattern is None


def test_an_image_anywhere_is_refused_by_name() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    request = _request()
    request.messages = [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": [{"type": "text", "text": "and"}, image]},
    ]
    with pytest.raises(InvalidRequest, match=r"images are not supported .*messages\[1\]"):
        refuse_images(request)
    refuse_images(_request())  # text only: nothing to refuse


def test_a_missing_output_budget_gets_the_default_and_says_so() -> None:
    request, flags = _request(), []
    default_output_budget(request, 4096, flags)
    assert (request.params.max_tokens, flags) == (4096, ["max_tokens_defaulted:4096"])
    asked = _request(params=SamplingParams(max_tokens=50))
    default_output_budget(asked, 4096, flags := [])
    assert (asked.params.max_tokens, flags) == (50, [])
