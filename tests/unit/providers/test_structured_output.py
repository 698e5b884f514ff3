"""Each API's structured-output option normalizes to one ResponseFormat, and its fate is recorded."""

from __future__ import annotations

from typing import Any

import pytest

from polar.errors import InvalidRequest
from polar.providers.anthropic import AnthropicProvider
from polar.providers.base import RequestContext
from polar.providers.google import GoogleProvider
from polar.providers.openai_chat import OpenAIChatProvider
from polar.providers.openai_responses import OpenAIResponsesProvider
from polar.providers.types import NormalizedRequest, ResponseFormat

SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
USER = [{"role": "user", "content": "hi"}]


def chat(extra: dict[str, Any]) -> NormalizedRequest:
    ctx = RequestContext(path="/v1/chat/completions")
    return OpenAIChatProvider().parse_request({"model": "m", "messages": USER, **extra}, ctx)


def responses(extra: dict[str, Any]) -> NormalizedRequest:
    ctx = RequestContext(path="/v1/responses")
    return OpenAIResponsesProvider().parse_request({"model": "m", "input": "hi", **extra}, ctx)


def claude(extra: dict[str, Any]) -> NormalizedRequest:
    body = {"model": "c", "max_tokens": 5, "messages": USER, **extra}
    return AnthropicProvider().parse_request(body, RequestContext(path="/v1/messages"))


def gemini(gen: dict[str, Any]) -> NormalizedRequest:
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": gen}
    ctx = RequestContext(path="/v1beta/models/g:generateContent")
    return GoogleProvider().parse_request(body, ctx)


def test_chat_json_schema_is_honoured_and_forwarded() -> None:
    spec = {"name": "x", "schema": SCHEMA, "strict": True}
    request = chat({"response_format": {"type": "json_schema", "json_schema": spec}})
    assert request.response_format == ResponseFormat("json_schema", SCHEMA, "x", True)
    assert request.capture.features["structured_output"] == "honoured"
    assert request.chat_body()["response_format"] == {"type": "json_schema", "json_schema": spec}


def test_chat_text_and_json_object() -> None:
    assert chat({"response_format": {"type": "text"}}).response_format is None
    request = chat({"response_format": {"type": "json_object"}})
    assert request.chat_body()["response_format"] == {"type": "json_object"}


def test_responses_text_format_is_mapped() -> None:
    fmt = {"type": "json_schema", "name": "x", "schema": SCHEMA, "strict": False}
    request = responses({"text": {"format": fmt}})
    assert request.response_format == ResponseFormat("json_schema", SCHEMA, "x", False)
    assert request.capture.features["structured_output"] == "mapped"
    assert responses({"text": {"format": {"type": "json_object"}}}).response_format == (
        ResponseFormat("json_object")
    )
    assert responses({"text": {"verbosity": "low"}}).response_format is None


@pytest.mark.parametrize("field", ["output_config", "output_format"])
def test_anthropic_output_format_is_mapped(field: str) -> None:
    fmt = {"type": "json_schema", "schema": SCHEMA}
    request = claude({field: {"format": fmt} if field == "output_config" else fmt})
    assert request.response_format == ResponseFormat("json_schema", SCHEMA)
    assert request.capture.features["structured_output"] == "mapped"
    assert claude({"output_config": {"effort": "low"}}).response_format is None


def test_gemini_schemas_are_mapped_to_json_schema() -> None:
    gemini_schema = {
        "type": "OBJECT",
        "properties": {"a": {"type": "STRING", "nullable": True}},
        "required": ["a"],
        "propertyOrdering": ["a"],
    }
    request = gemini({"responseMimeType": "application/json", "responseSchema": gemini_schema})
    assert request.response_format is not None
    assert request.response_format.schema == {
        "type": "object",
        "properties": {"a": {"type": ["string", "null"]}},
        "required": ["a"],
    }
    assert request.capture.features["structured_output"] == "mapped"
    by_json = gemini({"responseMimeType": "application/json", "responseJsonSchema": SCHEMA})
    assert by_json.response_format == ResponseFormat("json_schema", SCHEMA)
    assert gemini({"response_mime_type": "application/json"}).response_format == (
        ResponseFormat("json_object")
    )
    assert gemini({"responseMimeType": "text/plain"}).response_format is None


@pytest.mark.parametrize(
    "parse",
    [
        lambda: chat({"response_format": {"type": "grammar"}}),
        lambda: chat({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
        lambda: responses({"text": {"format": {"type": "grammar"}}}),
        lambda: claude({"output_config": {"format": {"type": "regex"}}}),
        lambda: gemini({"responseMimeType": "text/x.enum", "responseSchema": {"type": "STRING"}}),
    ],
)
def test_unsupported_formats_are_refused_naming_structured_output(parse: Any) -> None:
    with pytest.raises(InvalidRequest, match=r"structured output|schema"):
        parse()
