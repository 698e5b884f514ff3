from __future__ import annotations

from polar.engines.types import FLAG_MAX_TOKENS_CLAMPED
from polar.gateway.config import GatewayConfig, SamplingPolicy
from polar.gateway.policy import apply_policy, clamp_to_context
from polar.gateway.sessions import base_urls, key_from_headers, new_session_id, split_session_prefix
from polar.providers.types import NormalizedRequest, SamplingParams


def test_session_prefix_split():
    assert split_session_prefix("/s/abc/v1/messages") == ("abc", "/v1/messages")
    assert split_session_prefix("/s/abc") == ("abc", "")
    assert split_session_prefix("/v1/chat/completions") == (None, "/v1/chat/completions")


def test_keys_from_every_provider_location():
    assert key_from_headers({"authorization": "Bearer k1"}, {}) == "k1"
    assert key_from_headers({"x-api-key": "k2"}, {}) == "k2"
    assert key_from_headers({"x-goog-api-key": "k3"}, {}) == "k3"
    assert key_from_headers({}, {"key": "k4"}) == "k4"
    assert key_from_headers({"authorization": "Bearer "}, {}) is None


def test_session_ids_are_unguessable_and_urls_route_back():
    ids = {new_session_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(len(i) >= 32 for i in ids)
    urls = base_urls("http://gw:1/", "ps-x")
    assert urls == {
        "anthropic": "http://gw:1/s/ps-x",
        "openai": "http://gw:1/s/ps-x/v1",
        "google": "http://gw:1/s/ps-x",
    }


def _request(**params) -> NormalizedRequest:
    return NormalizedRequest(
        provider="openai_chat", model="client", messages=[], params=SamplingParams(**params)
    )


def test_policy_overrides_or_fills_and_clamps():
    config = GatewayConfig(
        served_model="served", sampling=SamplingPolicy(temperature=0.7, top_p=0.9, max_tokens=100)
    )
    request = _request(temperature=0.1, max_tokens=16384)
    assert apply_policy(request, config) == [FLAG_MAX_TOKENS_CLAMPED]
    assert (
        request.model,
        request.params.temperature,
        request.params.top_p,
        request.params.max_tokens,
    ) == ("served", 0.7, 0.9, 100)
    config.sampling.mode = "default"
    request = _request(temperature=0.1)
    assert apply_policy(request, config) == []
    assert (request.params.temperature, request.params.top_p, request.params.max_tokens) == (
        0.1,
        0.9,
        100,
    )


def test_clamp_to_context():
    request = _request(max_tokens=32000)
    assert clamp_to_context(request, prompt_tokens=1600, context_window=2048)
    assert request.params.max_tokens == 448
    assert not clamp_to_context(request, prompt_tokens=100, context_window=2048)
