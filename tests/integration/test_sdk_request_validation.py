"""Token counting and request validation through the official SDKs, against the strict
scripted engine (it refuses a model name it does not serve, as vLLM does): counting uses the
served model, and malformed requests the providers refuse are refused here too, by name."""

from __future__ import annotations

import anthropic
import openai
import pytest
from google import genai
from google.genai import errors, types

from polar.engines.scripted import ScriptedReply

pytestmark = pytest.mark.slow


def _openai(session) -> openai.OpenAI:
    return openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key, max_retries=0)


def _prompt_len(gateway, text: str) -> int:
    return len(gateway.engine.backend.prompt_ids([{"role": "user", "content": text}], None))


@pytest.mark.conformance(feature="token counting", api="anthropic", status="supported")
def test_anthropic_count_tokens_with_the_harness_model_name(live_gateway):
    session = live_gateway.new_session()
    client = anthropic.Anthropic(
        base_url=session.base_urls["anthropic"], api_key=session.key, max_retries=0
    )
    count = client.messages.count_tokens(
        model="claude-sonnet-4-5", messages=[{"role": "user", "content": "hello there"}]
    )
    assert count.input_tokens == _prompt_len(live_gateway, "hello there")


@pytest.mark.conformance(feature="token counting", api="openai_responses", status="supported")
def test_responses_input_tokens_with_the_harness_model_name(live_gateway):
    session = live_gateway.new_session()
    count = _openai(session).responses.input_tokens.count(model="gpt-5-codex", input="hello there")
    assert count.input_tokens == _prompt_len(live_gateway, "hello there")


@pytest.mark.conformance(feature="token counting", api="google", status="supported")
def test_gemini_count_tokens_with_the_harness_model_name(live_gateway):
    session = live_gateway.new_session()
    client = genai.Client(
        api_key=session.key, http_options=types.HttpOptions(base_url=session.base_urls["google"])
    )
    count = client.models.count_tokens(model="gemini-2.5-pro", contents="hello there")
    assert count.total_tokens == _prompt_len(live_gateway, "hello there")


@pytest.mark.conformance(feature="malformed stream / model", api="openai_chat", status="refused")
@pytest.mark.parametrize(
    ("override", "named"), [({"stream": "yes"}, "stream"), ({"model": [1, 2]}, "model")]
)
def test_chat_refuses_a_malformed_stream_or_model(live_gateway, override, named):
    session = live_gateway.new_session()
    with pytest.raises(openai.BadRequestError, match=named):
        _openai(session).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], extra_body=override
        )
    assert live_gateway.records(session.key) == []


@pytest.mark.conformance(feature="empty input", api="openai_responses", status="refused")
def test_responses_refuses_empty_input(live_gateway):
    session = live_gateway.new_session()
    with pytest.raises(openai.BadRequestError, match="input"):
        _openai(session).responses.create(model="m", input=[])
    assert live_gateway.records(session.key) == []


@pytest.mark.conformance(feature="empty input", api="anthropic", status="refused")
def test_anthropic_refuses_empty_messages(live_gateway):
    session = live_gateway.new_session()
    client = anthropic.Anthropic(
        base_url=session.base_urls["anthropic"], api_key=session.key, max_retries=0
    )
    with pytest.raises(anthropic.BadRequestError, match="messages"):
        client.messages.create(model="m", max_tokens=5, messages=[])
    assert live_gateway.records(session.key) == []


@pytest.mark.conformance(feature="empty input", api="google", status="refused")
def test_gemini_refuses_empty_contents(live_gateway):
    session = live_gateway.new_session()
    client = genai.Client(
        api_key=session.key, http_options=types.HttpOptions(base_url=session.base_urls["google"])
    )
    with pytest.raises(errors.ClientError, match="contents"):
        client.models.generate_content(
            model="gemini-x", contents=[types.Content(role="user", parts=[])]
        )
    assert live_gateway.records(session.key) == []


@pytest.mark.conformance(
    feature="presence / frequency penalty", api="openai_chat", status="supported"
)
def test_chat_penalties_reach_the_engine(live_gateway):
    session = live_gateway.new_session()
    live_gateway.script(ScriptedReply(content="ok"))
    _openai(session).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        presence_penalty=0.5,
        frequency_penalty=-0.25,
    )
    body = live_gateway.engine.backend.requests[-1]
    assert (body["presence_penalty"], body["frequency_penalty"]) == (0.5, -0.25)
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        _openai(session).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], presence_penalty=3
        )


@pytest.mark.conformance(feature="presence / frequency penalty", api="google", status="mapped")
def test_gemini_penalties_reach_the_engine(live_gateway):
    session = live_gateway.new_session()
    live_gateway.script(ScriptedReply(content="ok"))
    client = genai.Client(
        api_key=session.key, http_options=types.HttpOptions(base_url=session.base_urls["google"])
    )
    config = types.GenerateContentConfig(presence_penalty=0.5, frequency_penalty=1.0)
    client.models.generate_content(model="gemini-x", contents="hi", config=config)
    body = live_gateway.engine.backend.requests[-1]
    assert (body["presence_penalty"], body["frequency_penalty"]) == (0.5, 1.0)


@pytest.mark.conformance(feature="logit_bias", api="openai_chat", status="supported")
def test_chat_logit_bias_reaches_the_engine(live_gateway):
    session = live_gateway.new_session()
    live_gateway.script(ScriptedReply(content="ok"))
    _openai(session).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], logit_bias={"42": -100}
    )
    assert live_gateway.engine.backend.requests[-1]["logit_bias"] == {"42": -100.0}


@pytest.mark.conformance(feature="audio output", api="openai_chat", status="refused")
def test_chat_audio_output_is_refused_by_name(live_gateway):
    session = live_gateway.new_session()
    with pytest.raises(openai.BadRequestError, match="audio"):
        _openai(session).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "wav"},
        )
    assert live_gateway.records(session.key) == []


@pytest.mark.conformance(feature="image file sources", api="anthropic", status="refused")
def test_anthropic_image_from_the_files_api_is_refused_by_name(live_gateway):
    session = live_gateway.new_session()
    client = anthropic.Anthropic(
        base_url=session.base_urls["anthropic"], api_key=session.key, max_retries=0
    )
    image = {"type": "image", "source": {"type": "file", "file_id": "file_123"}}
    with pytest.raises(anthropic.BadRequestError, match="Files API"):
        client.messages.create(
            model="m",
            max_tokens=5,
            messages=[{"role": "user", "content": [image, {"type": "text", "text": "what?"}]}],
        )
    assert live_gateway.records(session.key) == []
