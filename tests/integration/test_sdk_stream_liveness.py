"""Stream liveness through a live gateway, with each official SDK: the headers leave before the
engine has finished, the provider's keep-alive frames follow while it works, the content only
once the capture record is durable, and a failure after the headers raises the SDK's own error."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from polar.engines.scripted import ScriptedReply
from polar.engines.scripted import logged_tokens as engine_tokens
from polar.gateway.services import app_services

pytestmark = pytest.mark.slow

DELAY_S = 1.0
KEEPALIVE_S = 0.1
GRACE_S = 0.2  # the headers' wait for a fast engine error (the engine fails after DELAY_S)
KEEP_ALIVE = {
    "openai_chat": b": keep-alive\n\n",
    "openai_responses": b": keep-alive\n\n",
    "anthropic": b'event: ping\ndata: {"type":"ping"}\n\n',
    "google": b'data: {"candidates":[{"content":{"role":"model","parts":[]},"index":0}]}\n\n',
}
APIS = list(KEEP_ALIVE)


@pytest.fixture
def gateway(live_gateway: Any) -> Iterator[Any]:
    config = app_services(live_gateway.app).config
    before = config.stream_keepalive_s, config.stream_status_grace_s
    config.stream_keepalive_s = KEEPALIVE_S
    config.stream_status_grace_s = GRACE_S
    yield live_gateway
    config.stream_keepalive_s, config.stream_status_grace_s = before


def _raw_request(api: str, session: Any) -> tuple[str, dict[str, Any]]:
    """A streamed request in ``api``'s own wire form: (url, JSON body)."""
    if api == "openai_chat":
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        return session.base_urls["openai"] + "/chat/completions", body
    if api == "openai_responses":
        return session.base_urls["openai"] + "/responses", {
            "model": "m",
            "stream": True,
            "input": "hi",
        }
    if api == "anthropic":
        return session.base_urls["anthropic"] + "/v1/messages", {
            "model": "m",
            "max_tokens": 64,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
    url = session.base_urls["google"] + "/v1beta/models/m:streamGenerateContent?alt=sse"
    return url, {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


@pytest.mark.parametrize(
    "api",
    [
        pytest.param(
            api,
            marks=pytest.mark.conformance(feature="stream_liveness", api=api, status="supported"),
        )
        for api in APIS
    ],
)
def test_headers_and_keepalives_before_the_engine_finishes(gateway: Any, api: str) -> None:
    session = gateway.new_session()
    gateway.script(ScriptedReply(content="Slow answer.", delay_s=DELAY_S))
    url, body = _raw_request(api, session)
    headers = {"authorization": f"Bearer {session.key}", "x-api-key": session.key}
    sent = time.monotonic()
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as reply:
        first_byte = time.monotonic() - sent
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        keep_alives = 0
        records_at_content: int | None = None
        rest = b""
        for chunk in reply.iter_raw():
            if records_at_content is None and chunk == KEEP_ALIVE[api] * (
                len(chunk) // len(KEEP_ALIVE[api])
            ):
                keep_alives += len(chunk) // len(KEEP_ALIVE[api])
                continue
            if records_at_content is None:
                records_at_content = len(gateway.records(session.key))
            rest += chunk
    assert first_byte < DELAY_S / 2
    assert keep_alives >= 3
    assert records_at_content == 1  # the capture is durable before any content is sent
    assert b"Slow answer" in rest.replace(b'"', b"")


def _sdk_stream(api: str, session: Any, retries: int = 0) -> tuple[str, int]:
    """(text, output tokens) of one streamed call through ``api``'s official SDK, which retries
    as it would against the provider ``retries`` times (0: never)."""
    if api == "openai_chat":
        client = openai.OpenAI(
            base_url=session.base_urls["openai"], api_key=session.key, max_retries=retries
        )
        chunks = list(
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, chunks[-1].usage.completion_tokens
    if api == "openai_responses":
        client = openai.OpenAI(
            base_url=session.base_urls["openai"], api_key=session.key, max_retries=retries
        )
        with client.responses.stream(model="m", input="hi") as stream:
            final = stream.get_final_response()
        return final.output_text, final.usage.output_tokens
    if api == "anthropic":
        aclient = anthropic.Anthropic(
            base_url=session.base_urls["anthropic"], api_key=session.key, max_retries=retries
        )
        with aclient.messages.stream(
            model="m", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            message = stream.get_final_message()
        return "".join(b.text for b in message.content if b.type == "text"), (
            message.usage.output_tokens
        )
    # google-genai retries only when asked to (its default client does not).
    retry = types.HttpRetryOptions(attempts=retries + 1, initial_delay=0.1) if retries else None
    gclient = genai.Client(
        api_key=session.key,
        http_options=types.HttpOptions(base_url=session.base_urls["google"], retry_options=retry),
    )
    chunks = list(gclient.models.generate_content_stream(model="m", contents="hi"))
    text = "".join(p.text or "" for c in chunks for p in c.candidates[0].content.parts or [])
    return text, chunks[-1].usage_metadata.candidates_token_count


@pytest.mark.parametrize(
    "api",
    [
        pytest.param(
            api,
            marks=pytest.mark.conformance(feature="stream_liveness", api=api, status="supported"),
        )
        for api in APIS
    ],
)
def test_sdks_accumulate_a_stream_with_keepalives(gateway: Any, api: str) -> None:
    session = gateway.new_session()
    gateway.script(ScriptedReply(content="Two files.", delay_s=0.5))
    text, output_tokens = _sdk_stream(api, session)
    assert text == "Two files."
    (record,) = gateway.records(session.key)
    (reply,) = gateway.engine_log
    assert (record.prompt_ids, record.sampled_ids, record.logprobs) == engine_tokens(reply)
    assert output_tokens == len(record.sampled_ids)


SDK_ERRORS: dict[str, type[Exception]] = {
    "openai_chat": openai.APIError,
    "openai_responses": openai.APIError,
    "anthropic": anthropic.APIStatusError,
    "google": genai_errors.APIError,
}


@pytest.mark.parametrize(
    "api",
    [
        pytest.param(
            api, marks=pytest.mark.conformance(feature="stream_error", api=api, status="supported")
        )
        for api in APIS
    ],
)
def test_engine_failure_after_headers_raises_the_sdk_error(gateway: Any, api: str) -> None:
    session = gateway.new_session()
    gateway.script(ScriptedReply(error_status=500, error_message="engine fell over", delay_s=0.3))
    with pytest.raises(SDK_ERRORS[api]) as caught:
        _sdk_stream(api, session)
    assert "engine fell over" in str(caught.value)
    assert gateway.records(session.key) == []


@pytest.mark.parametrize("api", APIS)
def test_an_engine_429_on_a_stream_keeps_its_status_and_the_sdk_retries(
    gateway: Any, api: str
) -> None:
    """An engine that refuses fast (a full queue: 429) is answered before the stream opens,
    with the engine's status, so the SDK's own retry and backoff run as against the provider."""
    session = gateway.new_session()
    busy = ScriptedReply(error_status=429, error_message="engine queue is full")
    gateway.script(busy, busy, ScriptedReply(content="Third time lucky."))
    text, _ = _sdk_stream(api, session, retries=2)
    assert text == "Third time lucky."
    assert len(gateway.engine.backend.requests) == 3  # the engine saw every try
    assert len(gateway.records(session.key)) == 1  # the one that was answered
    gateway.script(busy)
    url, body = _raw_request(api, session)
    headers = {"authorization": f"Bearer {session.key}", "x-api-key": session.key}
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as reply:
        assert reply.status_code == 429
        assert "engine queue is full" in reply.read().decode()


def test_validation_errors_keep_their_http_status(gateway: Any) -> None:
    """Before the stream opens (bad body, unknown key) the answer is a plain HTTP error."""
    session = gateway.new_session()
    client = openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key, max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages="not a list", stream=True)  # type: ignore[arg-type]
    unknown = session.base_urls["openai"].replace(session.key, "nobody")
    bad = openai.OpenAI(base_url=unknown, api_key="nobody", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
