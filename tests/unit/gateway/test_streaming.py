"""The live stream: keep-alives while the completion is produced, then its frames or an error."""

from __future__ import annotations

import asyncio
import json

import pytest

from polar.errors import EngineTimeout, EngineUnavailable, GatewayError, InvalidRequest, RateLimited
from polar.gateway.streaming import live_frames
from polar.providers.base import RequestContext
from polar.providers.registry import ProviderSet
from polar.providers.types import Completion

PROVIDERS = ProviderSet().by_name
CHAT = PROVIDERS["openai_chat"]


def _collect(completion_delay: float, outcome: Completion | Exception) -> list[bytes]:
    async def produce() -> Completion:
        await asyncio.sleep(completion_delay)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def run() -> list[bytes]:
        request = CHAT.parse_request(
            {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            RequestContext(path="/v1/chat/completions"),
        )
        return [frame async for frame in live_frames(CHAT, request, produce(), 0.02)]

    return asyncio.run(run())


def test_keepalives_until_the_completion_then_its_frames() -> None:
    frames = _collect(0.15, Completion(id="c", model="m", content="hello"))
    assert frames[0] == b": keep-alive\n\n"
    assert frames.count(b": keep-alive\n\n") >= 3
    assert b"hello" in frames[-1] and frames[-1].endswith(b"data: [DONE]\n\n")


def test_a_failure_is_the_providers_in_stream_error() -> None:
    frames = _collect(0.05, EngineTimeout("engine timed out"))
    error = json.loads(frames[-1].split(b"\n\n")[0].removeprefix(b"data: "))
    assert error["error"]["message"] == "engine timed out"


def test_a_bug_still_ends_the_stream_in_shape() -> None:
    frames = _collect(0.0, RuntimeError("boom"))
    assert b"internal gateway error" in frames[-1]


def test_keepalive_frames_per_provider() -> None:
    assert PROVIDERS["anthropic"].keep_alive() == b'event: ping\ndata: {"type":"ping"}\n\n'
    assert PROVIDERS["openai_responses"].keep_alive() == b": keep-alive\n\n"
    google = json.loads(PROVIDERS["google"].keep_alive().removeprefix(b"data: "))
    assert google["candidates"][0]["content"]["parts"] == []


def test_anthropic_stream_error_frame() -> None:
    assert PROVIDERS["anthropic"].stream_error(InvalidRequest("nope")) == (
        b"event: error\n"
        b'data: {"type":"error","error":{"type":"invalid_request_error","message":"nope"}}\n\n'
    )


def test_google_stream_error_frame() -> None:
    frame = PROVIDERS["google"].stream_error(EngineTimeout("slow"))
    assert frame.startswith(b'data: {"error":') and frame.endswith(b"\n\n")


@pytest.mark.parametrize(
    ("error", "failed_code"),
    [
        (EngineUnavailable("paused"), "server_error"),
        (RateLimited("busy"), "rate_limit_exceeded"),
        (InvalidRequest("bad"), "invalid_prompt"),
    ],
)
def test_responses_stream_error_events(error: GatewayError, failed_code: str) -> None:
    """Codex retries server_error / rate_limit_exceeded and stops on invalid_prompt."""
    first, second = PROVIDERS["openai_responses"].stream_error(error).split(b"\n\n")[:2]
    event = json.loads(first.split(b"data: ", 1)[1])
    assert (event["type"], event["code"], event["message"]) == ("error", failed_code, error.message)
    assert event["error"]["message"] == error.message
    failed = json.loads(second.split(b"data: ", 1)[1])
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"] == {"code": failed_code, "message": error.message}
