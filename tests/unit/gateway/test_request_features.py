"""What the token-in path does with tool_choice, images, parallel calls in history and a missing
output budget, by what the served family's format can express."""

from __future__ import annotations

import re
from typing import Any

import pytest

from artifacts import llama_cpp_template, qwen_tokenizer  # tests/artifacts.py
from polar.errors import InvalidRequest
from polar.gateway.request_features import (
    default_output_budget,
    enforce_tool_choice,
    forced_choice,
    refuse_images,
    refuse_parallel_history,
)
from polar.providers.types import NormalizedRequest, ResponseFormat, SamplingParams
from polar.rendering.families.registry import get_family
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


def _image_request() -> NormalizedRequest:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    request = _request()
    request.messages = [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": [{"type": "text", "text": "and"}, image]},
    ]
    return request


def test_an_image_anywhere_is_refused_by_name() -> None:
    with pytest.raises(InvalidRequest, match=r"images are not supported .*messages\[1\]"):
        refuse_images(_image_request(), get_family("smollm2"))
    refuse_images(_request(), get_family("smollm2"))  # text only: nothing to refuse


@pytest.mark.parametrize("name", ["llama3", "smollm2", "glm47"])
def test_an_image_for_a_text_only_family_says_it_is_not_multimodal(name: str) -> None:
    """No render mode serves it: the refusal says so, as vLLM's 400 does, instead of sending
    the caller to render: engine."""
    with pytest.raises(InvalidRequest) as refused:
        refuse_images(_image_request(), get_family(name))
    assert f"model family {name} is not a multimodal model" in str(refused.value)
    assert "render: engine" not in str(refused.value)


@pytest.mark.parametrize("name", ["qwen3_5", "kimi_k2"])
def test_an_image_for_a_multimodal_family_names_the_engine_path(name: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        refuse_images(_image_request(), get_family(name))
    assert f"serve this multimodal model ({name}) with render: engine" in str(refused.value)


def _two_calls_in_history() -> NormalizedRequest:
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": "{}"}}
        for i, n in enumerate(("shell", "read"))
    ]
    request = _request()
    request.messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_0", "content": "a"},
        {"role": "tool", "tool_call_id": "call_1", "content": "b"},
    ]
    return request


@pytest.mark.parametrize("name", ["llama3", "gpt_oss"])
def test_a_turn_with_several_calls_is_refused_for_a_one_call_family(name: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        refuse_parallel_history(_two_calls_in_history(), get_family(name))
    words = f"messages[1] is an assistant turn with 2 tool calls, but model family {name}"
    assert words in str(refused.value)
    refuse_parallel_history(_request(), get_family(name))  # no such turn: nothing to refuse
    refuse_parallel_history(_two_calls_in_history(), get_family("qwen3"))  # it renders both


def test_gpt_oss_s_template_would_drop_the_second_call_silently() -> None:
    """Why the refusal is needed where the template raises nothing: gpt-oss's real template
    renders an assistant turn's first call only."""
    tok = qwen_tokenizer(llama_cpp_template("openai-gpt-oss-120b.jinja"))
    messages = _two_calls_in_history().messages
    text = tok.apply_chat_template(messages, tokenize=False)
    assert "to=functions.shell" in text and "to=functions.read" not in text


def test_a_missing_output_budget_gets_the_default_and_says_so() -> None:
    request, flags = _request(), []
    default_output_budget(request, 4096, flags)
    assert (request.params.max_tokens, flags) == (4096, ["max_tokens_defaulted:4096"])
    asked = _request(params=SamplingParams(max_tokens=50))
    default_output_budget(asked, 4096, flags := [])
    assert (asked.params.max_tokens, flags) == (50, [])
