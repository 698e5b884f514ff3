from __future__ import annotations

import pytest

from polar.errors import ContextLengthExceeded
from polar.gateway.config import GatewayConfig, SamplingPolicy
from polar.gateway.policy import apply_policy
from polar.gateway.sessions import base_urls, key_from_headers, split_session_prefix
from polar.gateway.token_prompts import fit_output_budget
from polar.providers.types import NormalizedRequest, SamplingParams
from polar.schemas.flags import FLAG_MAX_TOKENS_CLAMPED
from polar.schemas.ids import new_session_id


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


def test_output_budget_is_fitted_to_the_context_and_the_record_says_so():
    request = _request(max_tokens=32000)
    flags: list[str] = []
    fit_output_budget(request, prompt_tokens=1600, window=2048, flags=flags)
    assert request.params.max_tokens == 448
    assert flags == ["max_tokens_clamped_to_context", "max_tokens:32000->448"]
    flags.clear()
    fit_output_budget(request, prompt_tokens=100, window=2048, flags=flags)
    assert flags == [] and request.params.max_tokens == 448


def test_a_prompt_that_fills_the_window_is_refused_with_the_real_counts():
    with pytest.raises(ContextLengthExceeded) as info:
        fit_output_budget(_request(max_tokens=10), prompt_tokens=2048, window=2048, flags=[])
    assert (info.value.prompt_tokens, info.value.limit, info.value.status) == (2048, 2048, 400)
