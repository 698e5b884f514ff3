"""Structured output through the official SDKs: every API's JSON-schema option reaches the engine
(as chat ``response_format`` with engine-side rendering, as vLLM's ``structured_outputs`` on a
token prompt with gateway-side rendering), streaming and not; unsupported kinds are refused with
the SDK's own exception naming structured output."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import errors, types

from polar.engines.scripted import ScriptedReply

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
ANSWER = {"city": "Oslo", "days": 3}
MESSAGES = [{"role": "user", "content": "Plan a trip."}]


def _sent_schema(gateway: Any) -> dict[str, Any] | None:
    """The schema the engine was asked to follow, from the body it last received."""
    body = gateway.engine.backend.requests[-1]
    if gateway.render_mode == "gateway":
        return body["structured_outputs"].get("json")
    spec = body["response_format"]
    return spec["json_schema"]["schema"] if spec["type"] == "json_schema" else spec


def _fate(gateway: Any, key: str) -> list[str]:
    return [n for n in gateway.records(key)[-1].notes if n.startswith("feature structured_output")]


def _script(gateway: Any) -> None:
    gateway.script(ScriptedReply(content=json.dumps(ANSWER)))


@pytest.mark.parametrize(
    "stream",
    [
        pytest.param(
            False,
            marks=pytest.mark.conformance(
                feature="structured_output", api="openai_chat", status="supported"
            ),
        ),
        True,
    ],
)
def test_openai_chat_json_schema_reaches_the_engine(noncanonical_gateway, stream):
    gateway = noncanonical_gateway
    session = gateway.new_session()
    client = openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key)
    _script(gateway)
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "trip", "schema": SCHEMA, "strict": True},
    }
    if stream:
        chunks = client.chat.completions.create(
            model="m", messages=MESSAGES, response_format=response_format, stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        reply = client.chat.completions.create(
            model="m", messages=MESSAGES, response_format=response_format
        )
        text = reply.choices[0].message.content or ""
    assert json.loads(text) == ANSWER
    assert _sent_schema(gateway) == SCHEMA
    assert _fate(gateway, session.key) == ["feature structured_output: honoured"]


def test_openai_chat_json_object_reaches_the_engine(noncanonical_gateway):
    gateway = noncanonical_gateway
    session = gateway.new_session()
    client = openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key)
    _script(gateway)
    reply = client.chat.completions.create(
        model="m", messages=MESSAGES, response_format={"type": "json_object"}
    )
    assert json.loads(reply.choices[0].message.content or "") == ANSWER
    body = gateway.engine.backend.requests[-1]
    if gateway.render_mode == "gateway":
        assert body["structured_outputs"] == {"json_object": True}
    else:
        assert body["response_format"] == {"type": "json_object"}


@pytest.mark.conformance(
    feature="structured_output: other formats", api="openai_chat", status="refused"
)
def test_openai_chat_unsupported_format_is_refused(live_gateway):
    session = live_gateway.new_session()
    client = openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="structured output"):
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            response_format={"type": "grammar"},  # type: ignore[arg-type, typeddict-item]
        )
    assert live_gateway.engine.backend.requests == []


@pytest.mark.parametrize(
    "stream",
    [
        pytest.param(
            False,
            marks=pytest.mark.conformance(
                feature="structured_output", api="openai_responses", status="mapped"
            ),
        ),
        True,
    ],
)
def test_responses_text_format_reaches_the_engine(noncanonical_gateway, stream):
    gateway = noncanonical_gateway
    session = gateway.new_session()
    client = openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key)
    _script(gateway)
    text: Any = {
        "format": {"type": "json_schema", "name": "trip", "schema": SCHEMA, "strict": True}
    }
    if stream:
        events = list(client.responses.create(model="m", input="Plan.", text=text, stream=True))
        output = events[-1].response.output_text  # type: ignore[union-attr]
    else:
        output = client.responses.create(model="m", input="Plan.", text=text).output_text
    assert json.loads(output) == ANSWER
    assert _sent_schema(gateway) == SCHEMA
    assert _fate(gateway, session.key) == ["feature structured_output: mapped"]


@pytest.mark.conformance(
    feature="structured_output: other formats", api="openai_responses", status="refused"
)
def test_responses_unsupported_format_is_refused(live_gateway):
    session = live_gateway.new_session()
    client = openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="structured output"):
        client.responses.create(model="m", input="Plan.", text={"format": {"type": "grammar"}})  # type: ignore[typeddict-item]


@pytest.mark.parametrize(
    "stream",
    [
        pytest.param(
            False,
            marks=pytest.mark.conformance(
                feature="structured_output", api="anthropic", status="mapped"
            ),
        ),
        True,
    ],
)
def test_anthropic_output_config_format_reaches_the_engine(noncanonical_gateway, stream):
    gateway = noncanonical_gateway
    session = gateway.new_session()
    client = anthropic.Anthropic(base_url=session.base_urls["anthropic"], api_key=session.key)
    _script(gateway)
    config: Any = {"format": {"type": "json_schema", "schema": SCHEMA}}
    kwargs: Any = {"model": "claude-x", "max_tokens": 200, "messages": MESSAGES}
    if stream:
        with client.messages.stream(**kwargs, output_config=config) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**kwargs, output_config=config)
    assert json.loads(message.content[0].text) == ANSWER  # type: ignore[union-attr]
    assert _sent_schema(gateway) == SCHEMA
    assert _fate(gateway, session.key) == ["feature structured_output: mapped"]


@pytest.mark.conformance(
    feature="structured_output: other formats", api="anthropic", status="refused"
)
def test_anthropic_unsupported_format_is_refused(live_gateway):
    session = live_gateway.new_session()
    client = anthropic.Anthropic(
        base_url=session.base_urls["anthropic"], api_key=session.key, max_retries=0
    )
    with pytest.raises(anthropic.BadRequestError, match="structured output"):
        client.messages.create(
            model="claude-x",
            max_tokens=50,
            messages=MESSAGES,  # type: ignore[arg-type]
            output_config={"format": {"type": "regex", "schema": {}}},  # type: ignore[typeddict-item]
        )


def _google(session: Any) -> genai.Client:
    return genai.Client(
        api_key=session.key, http_options=types.HttpOptions(base_url=session.base_urls["google"])
    )


GEMINI_SCHEMA = types.Schema(
    type=types.Type.OBJECT,
    properties={"city": types.Schema(type=types.Type.STRING), "days": types.Schema(type="INTEGER")},
    required=["city", "days"],
)


@pytest.mark.parametrize(
    "stream",
    [
        pytest.param(
            False,
            marks=pytest.mark.conformance(
                feature="structured_output", api="google", status="mapped"
            ),
        ),
        True,
    ],
)
def test_google_response_schema_reaches_the_engine(noncanonical_gateway, stream):
    gateway = noncanonical_gateway
    session = gateway.new_session()
    client = _google(session)
    _script(gateway)
    config = types.GenerateContentConfig(
        response_mime_type="application/json", response_schema=GEMINI_SCHEMA
    )
    if stream:
        chunks = client.models.generate_content_stream(
            model="gemini-x", contents="Plan.", config=config
        )
        text = "".join(c.text or "" for c in chunks)
    else:
        text = (
            client.models.generate_content(model="gemini-x", contents="Plan.", config=config).text
            or ""
        )
    assert json.loads(text) == ANSWER
    assert _sent_schema(gateway) == {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    }
    assert _fate(gateway, session.key) == ["feature structured_output: mapped"]


def test_google_response_json_schema_reaches_the_engine(noncanonical_gateway):
    gateway = noncanonical_gateway
    session = gateway.new_session()
    _script(gateway)
    config = types.GenerateContentConfig(
        response_mime_type="application/json", response_json_schema=SCHEMA
    )
    client = _google(session)
    text = client.models.generate_content(model="gemini-x", contents="Plan.", config=config).text
    assert json.loads(text or "") == ANSWER
    assert _sent_schema(gateway) == SCHEMA


@pytest.mark.conformance(feature="structured_output: other formats", api="google", status="refused")
def test_google_enum_output_is_refused(live_gateway):
    session = live_gateway.new_session()
    config = types.GenerateContentConfig(
        response_mime_type="text/x.enum",
        response_schema=types.Schema(type=types.Type.STRING, enum=["a", "b"]),
    )
    client = _google(session)
    with pytest.raises(errors.ClientError, match="structured output"):
        client.models.generate_content(model="gemini-x", contents="Hi", config=config)
