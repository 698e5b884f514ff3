"""Context overflow through each official SDK: the provider's own error, code and wording, with
the real token counts, streamed or not, in both render modes (issue 16, item 5)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import errors, types
from google.genai._interactions_errors import BadRequestError

from polar.capture.store import CaptureStore
from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine, ScriptedReply
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.server import BackgroundServer

pytestmark = pytest.mark.slow

WINDOW = 256
LONG = "word " * 400  # ~400 tokens with SmolLM2's tokenizer


@pytest.fixture(scope="module", params=["engine", "gateway"])
def small_gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tokenizer: Any
) -> Iterator[tuple[str, ScriptedBackend]]:
    mode = str(request.param)
    db: Path = tmp_path_factory.mktemp(f"context-{mode}") / "c.db"
    backend = ScriptedBackend(
        Script(default=ScriptedReply(content="ok")), tokenizer=tokenizer, max_model_len=WINDOW
    )
    config = GatewayConfig(capture_db=db, auto_register=True, render={"mode": mode})
    app = create_app(config, engine=ScriptedEngine(backend), store=CaptureStore(db))
    with BackgroundServer(app) as server:
        yield server.url, backend


def _prompt_tokens(message: str) -> int:
    """The prompt's token count the error names; it must be the real one (over the window)."""
    counts = [int(n) for n in re.findall(r"\d+", message) if int(n) != WINDOW]
    assert counts, message
    assert counts[0] > WINDOW
    return counts[0]


@pytest.mark.conformance(feature="context length error", api="openai_chat", status="supported")
@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_context_error(small_gateway, stream):
    url, backend = small_gateway
    client = openai.OpenAI(base_url=f"{url}/s/ctx-chat/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="m", stream=stream, messages=[{"role": "user", "content": LONG}]
        )
    assert info.value.code == "context_length_exceeded"
    assert f"maximum context length is {WINDOW} tokens" in info.value.message
    _prompt_tokens(info.value.message)
    assert backend.log == []


@pytest.mark.conformance(feature="context length error", api="openai_responses", status="supported")
@pytest.mark.parametrize("stream", [False, True])
def test_openai_responses_context_error(small_gateway, stream):
    url, backend = small_gateway
    client = openai.OpenAI(base_url=f"{url}/s/ctx-resp/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", stream=stream, input=LONG)
    assert info.value.code == "context_length_exceeded"
    assert f"maximum context length is {WINDOW} tokens" in info.value.message
    _prompt_tokens(info.value.message)
    assert backend.log == []


@pytest.mark.conformance(feature="context length error", api="anthropic", status="supported")
@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_context_error(small_gateway, stream):
    url, backend = small_gateway
    client = anthropic.Anthropic(base_url=f"{url}/s/ctx-anthropic", api_key="k", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model="m", max_tokens=16, stream=stream, messages=[{"role": "user", "content": LONG}]
        )
    message = info.value.body["error"]["message"]
    assert re.fullmatch(rf"prompt is too long: \d+ tokens > {WINDOW} maximum", message)
    _prompt_tokens(message)
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert backend.log == []


@pytest.mark.conformance(feature="context length error", api="google", status="supported")
@pytest.mark.parametrize("stream", [False, True])
def test_google_context_error(small_gateway, stream):
    url, backend = small_gateway
    client = genai.Client(
        api_key="k", http_options=types.HttpOptions(base_url=f"{url}/s/ctx-google")
    )
    with pytest.raises(errors.ClientError) as info:
        if stream:
            list(client.models.generate_content_stream(model="m", contents=LONG))
        else:
            client.models.generate_content(model="m", contents=LONG)
    assert info.value.code == 400
    assert info.value.status == "INVALID_ARGUMENT"
    assert f"exceeds the maximum number of tokens allowed ({WINDOW})" in str(info.value.message)
    _prompt_tokens(str(info.value.message))
    assert backend.log == []


@pytest.mark.conformance(
    feature="context length error", api="google_interactions", status="supported"
)
@pytest.mark.parametrize("stream", [False, True])
def test_google_interactions_context_error(small_gateway, stream):
    url, backend = small_gateway
    options = types.HttpOptions(
        base_url=f"{url}/s/ctx-interactions", retry_options=types.HttpRetryOptions(attempts=1)
    )
    client = genai.Client(api_key="k", http_options=options)
    with pytest.raises(BadRequestError) as info:
        if stream:
            list(client.interactions.create(model="m", input=LONG, stream=True))
        else:
            client.interactions.create(model="m", input=LONG)
    assert info.value.status_code == 400
    message = str(info.value.body["error"]["message"])
    assert info.value.body["error"]["code"] == "invalid_request"
    assert f"exceeds the maximum number of tokens allowed ({WINDOW})" in message
    _prompt_tokens(message)
    assert backend.log == []
