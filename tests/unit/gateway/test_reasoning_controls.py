"""Reasoning controls through the gateway, in BOTH render modes, each on the record by name.

Every API's switch (Anthropic ``thinking``, OpenAI effort ``none``, Gemini ``thinkingBudget``) and
effort (``output_config.effort``, ``reasoning_effort``, ``reasoning.effort``, ``thinkingLevel``)
becomes, under engine rendering, the engine's own chat fields (``chat_template_kwargs``,
``reasoning_effort``) and, under gateway rendering, the served template's own variables where it
reads them (Qwen3's ``enable_thinking``, gpt-oss's ``reasoning_effort``: rendered here with their
real templates), else a note that the family has none. A reply that omits its reasoning still
has the sampled reasoning on the record, and history carries it back exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from artifacts import llama_cpp_template, qwen_tokenizer  # tests/artifacts.py
from polar.capture.records import CaptureRecord
from polar.capture.store import CaptureStore
from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine, ScriptedReply
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.request_features import reasoning_variables
from polar.gateway.services import app_services
from polar.providers.reasoning_codec import decode_reasoning
from polar.providers.types import (
    NormalizedRequest,
    ReasoningControls,
    ReasoningEffort,
    ReasoningSwitch,
)
from polar.rendering.families.registry import get_family
from polar.rendering.renderer import Renderer
from polar.rendering.turns import TurnBook

from ..rendering.test_special_token_families import GPT_OSS_SPECIALS

MODES = ("engine", "gateway")
USER = {"role": "user", "content": "hi"}

# One request per API asking for its switch off, and the feature name the record gives it.
SWITCH_OFF: dict[str, tuple[dict[str, Any], str]] = {
    "anthropic": ({"thinking": {"type": "disabled"}}, "thinking disabled"),
    "openai_chat": ({"reasoning_effort": "none"}, "reasoning_effort none"),
    "openai_responses": ({"reasoning": {"effort": "none"}}, "reasoning.effort none"),
    "google": (
        {"generationConfig": {"thinkingConfig": {"thinkingBudget": 0}}},
        "thinkingConfig.thinkingBudget 0",
    ),
}
SWITCH_ON: dict[str, tuple[dict[str, Any], str]] = {
    "anthropic": ({"thinking": {"type": "adaptive"}}, "thinking adaptive"),
    "google": (
        {"generationConfig": {"thinkingConfig": {"thinkingBudget": -1}}},
        "thinkingConfig.thinkingBudget -1",
    ),
}
EFFORT_HIGH: dict[str, tuple[dict[str, Any], str]] = {
    "anthropic": ({"output_config": {"effort": "high"}}, "output_config.effort"),
    "openai_chat": ({"reasoning_effort": "high"}, "reasoning_effort"),
    "openai_responses": ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
    "google": (
        {"generationConfig": {"thinkingConfig": {"thinkingLevel": "HIGH"}}},
        "thinkingConfig.thinkingLevel",
    ),
    "google_interactions": (
        {"generation_config": {"thinking_level": "high"}},
        "generation_config.thinking_level",
    ),
}


def in_both_modes(feature: str, cases: dict[str, Any]) -> pytest.MarkDecorator:
    """Parametrize over (render mode, api), each case a conformance cell named by its mode."""
    params = [
        pytest.param(
            mode,
            api,
            marks=pytest.mark.conformance(
                feature=f"{feature} ({mode} rendering)", api=api, status="mapped"
            ),
            id=f"{api}-{mode}",
        )
        for api in cases
        for mode in MODES
    ]
    return pytest.mark.parametrize(("mode", "api"), params)


class Gateway:
    """An in-process gateway in one render mode before the scripted engine (SmolLM2's real
    tokenizer: a family that does not reason, so gateway rendering notes there is nothing to
    switch; the switch itself is rendered below with Qwen3's real template)."""

    def __init__(self, mode: str, tmp_path: Path, tokenizer: Any) -> None:
        self.script = Script()
        config = GatewayConfig(
            capture_db=tmp_path / "c.db",
            served_model="SmolLM2-135M-Instruct",
            render={"mode": mode, "tool_parser": "qwen3"},
        )
        self.backend = ScriptedBackend(self.script, tokenizer=tokenizer)
        self.app = create_app(
            config, engine=ScriptedEngine(self.backend), store=CaptureStore(config.capture_db)
        )

    async def call(self, api: str, extra: dict[str, Any], key: str | None = None) -> Any:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app)) as client:
            if key is None:
                admin = {"authorization": f"Bearer {app_services(self.app).admin_token}"}
                made = await client.post("http://gw/polar/sessions", json={}, headers=admin)
                key = str(made.json()["api_key"])
            path, body = _request(api)
            reply = await client.post(f"http://gw/s/{key}{path}", json=body | extra, timeout=60)
        return key, reply

    def records(self, key: str) -> list[CaptureRecord]:
        return list(app_services(self.app).store.records(key))


def _request(api: str) -> tuple[str, dict[str, Any]]:
    if api == "anthropic":
        return "/v1/messages", {"model": "m", "max_tokens": 256, "messages": [USER]}
    if api == "openai_chat":
        return "/v1/chat/completions", {"model": "m", "messages": [USER]}
    if api == "openai_responses":
        return "/v1/responses", {"model": "m", "input": "hi"}
    if api == "google_interactions":
        return "/v1/interactions", {"model": "m", "input": "hi"}
    return "/v1beta/models/m:generateContent", {"contents": [{"parts": [{"text": "hi"}]}]}


@pytest.fixture
def gateway(mode: str, tmp_path: Path, tokenizer: Any) -> Gateway:
    return Gateway(mode, tmp_path, tokenizer)


async def _one_call(gateway: Gateway, api: str, extra: dict[str, Any]) -> CaptureRecord:
    gateway.script.push(ScriptedReply(content="ok"))
    key, reply = await gateway.call(api, extra)
    assert reply.status_code == 200, reply.text
    (record,) = gateway.records(key)
    return record


def _notes_of(record: CaptureRecord, feature: str) -> list[str]:
    return [n for n in record.notes if n.startswith(f"{feature}: ")]


@in_both_modes("reasoning switch off", SWITCH_OFF)
async def test_the_switch_off_is_mapped_by_name(gateway: Gateway, mode: str, api: str) -> None:
    extra, feature = SWITCH_OFF[api]
    record = await _one_call(gateway, api, extra)
    assert f"feature {feature}: mapped" in record.notes
    sent = gateway.backend.requests[-1]
    if mode == "engine":
        assert sent["chat_template_kwargs"] == {"enable_thinking": False}
        assert "chat_template_kwargs.enable_thinking=false" in _notes_of(record, feature)[0]
    else:
        assert "chat_template_kwargs" not in sent  # a token prompt: the template was ours
        assert "does not reason" in _notes_of(record, feature)[0]


@in_both_modes("reasoning switch on", SWITCH_ON)
async def test_the_switch_on_is_mapped_by_name(gateway: Gateway, mode: str, api: str) -> None:
    extra, feature = SWITCH_ON[api]
    record = await _one_call(gateway, api, extra)
    assert f"feature {feature}: mapped" in record.notes
    sent = gateway.backend.requests[-1]
    if mode == "engine":
        assert sent["chat_template_kwargs"] == {"enable_thinking": True}
    else:
        assert "nothing to switch on" in _notes_of(record, feature)[0]


@in_both_modes("reasoning effort", EFFORT_HIGH)
async def test_the_effort_is_mapped_by_name(gateway: Gateway, mode: str, api: str) -> None:
    extra, feature = EFFORT_HIGH[api]
    record = await _one_call(gateway, api, extra)
    assert f"feature {feature}: mapped" in record.notes
    sent = gateway.backend.requests[-1]
    if mode == "engine":
        assert sent["reasoning_effort"] == "high"
    else:
        assert "reasoning_effort" not in sent
        assert "has no effort control: not applied" in _notes_of(record, feature)[0]


@pytest.mark.conformance(
    feature="reasoning omitted from the reply (display omitted, includeThoughts false)",
    api="anthropic",
    status="supported",
)
@pytest.mark.parametrize("mode", MODES)
async def test_omitted_thinking_is_still_recorded_and_carried_back_exactly(
    gateway: Gateway, mode: str
) -> None:
    """Claude Code's ``display: omitted``: the reply's thinking block is empty but signed; the
    record keeps the sampled reasoning (ids and text), and the next call's history, carrying
    only the signature, gets it back: under gateway rendering the prompt extends the sampled
    turn exactly."""
    gateway.script.push(
        ScriptedReply(content="", reasoning="I should list.", tool_calls=[("ls", {})]),
        ScriptedReply(content="done"),
    )
    tools = [{"name": "ls", "input_schema": {"type": "object"}}]
    thinking = {"thinking": {"type": "adaptive", "display": "omitted"}, "tools": tools}
    key, first = await gateway.call("anthropic", thinking)
    assert first.status_code == 200, first.text
    block, call = first.json()["content"]
    assert block["thinking"] == "" and decode_reasoning(block["signature"]) == "I should list."
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": "a.txt"}
    history = [USER, {"role": "assistant", "content": [block, call]}]
    body = {"messages": [*history, {"role": "user", "content": [result]}], **thinking}
    _, second = await gateway.call("anthropic", body, key)
    assert second.status_code == 200, second.text
    records = gateway.records(key)
    assert "feature thinking display omitted: honoured" in records[0].notes
    assert records[0].response["reasoning"] == "I should list."
    assert "I should list." in gateway.backend.tokenizer.decode(records[0].sampled_ids)
    assert records[1].upstream_request["messages"][1]["reasoning"] == "I should list."
    if mode == "gateway":
        head = records[0].prompt_ids + records[0].sampled_ids
        assert records[1].prompt_ids[: len(head)] == head


# --- gateway rendering with the families' real templates ------------------------------------


def _asking(switch: bool | None = None, effort: str | None = None) -> NormalizedRequest:
    controls = ReasoningControls(
        switch=None if switch is None else ReasoningSwitch("thinking x", on=switch),
        effort=None if effort is None else ReasoningEffort("reasoning.effort", effort, "high"),
    )
    return NormalizedRequest("anthropic", "m", [USER], reasoning=controls)


def _prompt(renderer: Renderer, request: NormalizedRequest) -> str:
    family = renderer.family
    variables = reasoning_variables(request, family, *renderer.reasoning_variables())
    return renderer.decode(renderer.plan(TurnBook(), request, variables).ids)


def test_qwen3s_switch_is_its_enable_thinking_variable() -> None:
    template = llama_cpp_template("Qwen-Qwen3-0.6B.jinja")
    renderer = Renderer(qwen_tokenizer(template), get_family("qwen3"))
    assert renderer.reasoning_variables() == ("enable_thinking", None)
    off, on, unset = _asking(switch=False), _asking(switch=True), _asking()
    assert _prompt(renderer, off).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert _prompt(renderer, on) == _prompt(renderer, unset)
    assert _prompt(renderer, on).endswith("<|im_start|>assistant\n")
    assert off.capture.features == {"thinking x": "mapped"}
    assert off.capture.notes == ["thinking x: enable_thinking=false in the chat template"]
    effort = _asking(effort="xhigh")
    _prompt(renderer, effort)
    assert effort.capture.notes == [
        "reasoning.effort: xhigh: model family qwen3's template has no effort control: not applied"
    ]


def test_gpt_oss_effort_is_its_reasoning_effort_variable() -> None:
    template = llama_cpp_template("openai-gpt-oss-120b.jinja")
    tokenizer = qwen_tokenizer(template, [(t, True) for t in GPT_OSS_SPECIALS])
    renderer = Renderer(tokenizer, get_family("gpt_oss"))
    assert renderer.reasoning_variables() == (None, "reasoning_effort")
    assert "Reasoning: medium" in _prompt(renderer, _asking())
    high = _asking(effort="xhigh")
    assert "Reasoning: high" in _prompt(renderer, high)
    assert high.capture.notes == [
        "reasoning.effort: xhigh: reasoning_effort=high in the chat template"
    ]
    off = _asking(switch=False)
    assert "Reasoning: medium" in _prompt(renderer, off)
    assert "has no reasoning switch" in off.capture.notes[0]
