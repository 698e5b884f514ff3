"""Reasoning and context fields read by each adapter, and the request features that used to be
dropped or skipped with a 200: each is honoured, mapped or refused by name, on the record.

What becomes of the switch and effort per render mode is tested through the gateway in
tests/unit/gateway/test_reasoning_controls.py; here, what each API's fields read as, and the
fields decided by the adapter alone (the same in both render modes).
"""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from polar.errors import InvalidRequest
from polar.gateway.request_features import enforce_tool_choice
from polar.providers.anthropic import AnthropicProvider
from polar.providers.base import RequestContext
from polar.providers.google import GoogleProvider
from polar.providers.openai_chat import OpenAIChatProvider
from polar.providers.openai_responses import OpenAIResponsesProvider
from polar.providers.reasoning_codec import decode_reasoning
from polar.providers.types import (
    Completion,
    NormalizedRequest,
    ReasoningControls,
    ReasoningEffort,
    ReasoningSwitch,
)
from polar.rendering.parsers.registry import get_tool_parser

ANTHROPIC, GOOGLE = AnthropicProvider(), GoogleProvider()
CHAT, RESPONSES = OpenAIChatProvider(), OpenAIResponsesProvider()
USER = {"role": "user", "content": "hi"}
GEMINI_PATH = "/v1beta/models/m:generateContent"


def anthropic(**extra: Any) -> NormalizedRequest:
    body = {"model": "m", "max_tokens": 64, "messages": [USER]} | extra
    return ANTHROPIC.parse_request(body, RequestContext("/v1/messages"))


def gemini(thinking: dict[str, Any]) -> NormalizedRequest:
    body = {
        "contents": [{"parts": [{"text": "hi"}]}],
        "generationConfig": {"thinkingConfig": thinking},
    }
    return GOOGLE.parse_request(body, RequestContext(GEMINI_PATH))


# --- Anthropic thinking, output_config.effort -------------------------------------------------


@pytest.mark.parametrize(
    ("thinking", "switch"),
    [
        ({"type": "enabled", "budget_tokens": 2048}, ReasoningSwitch("thinking enabled", True)),
        ({"type": "adaptive"}, ReasoningSwitch("thinking adaptive", True)),
        ({"type": "disabled"}, ReasoningSwitch("thinking disabled", False)),
    ],
)
def test_anthropic_thinking_is_the_reasoning_switch(
    thinking: dict[str, Any], switch: ReasoningSwitch
) -> None:
    request = anthropic(thinking=thinking, output_config={"effort": "max"})
    assert request.reasoning == ReasoningControls(
        switch=switch, effort=ReasoningEffort("output_config.effort", "max", "high")
    )


@pytest.mark.conformance(feature="thinking budget", api="anthropic", status="mapped")
def test_a_thinking_budget_is_mapped_to_nothing_by_name() -> None:
    request = anthropic(thinking={"type": "enabled", "budget_tokens": 2048})
    assert request.capture.features == {"thinking.budget_tokens": "mapped"}
    assert "no engine here takes a thinking budget" in request.capture.notes[0]


@pytest.mark.conformance(feature="thinking budget", api="google", status="mapped")
def test_a_gemini_thinking_budget_switches_on_and_is_mapped_to_nothing() -> None:
    request = gemini({"thinkingBudget": 8192, "includeThoughts": True})
    assert request.reasoning.switch == ReasoningSwitch("thinkingConfig.thinkingBudget 8192", True)
    assert request.capture.features == {
        "thinkingConfig.thinkingBudget": "mapped",
        "thinkingConfig.includeThoughts": "honoured",
    }


@pytest.mark.conformance(feature="thinking display summarized", api="anthropic", status="mapped")
def test_summarized_thinking_comes_back_whole() -> None:
    request = anthropic(thinking={"type": "adaptive", "display": "summarized"})
    reply = ANTHROPIC.render_response(Completion("c", "m", "ok", reasoning="r"), request)
    assert reply["content"][0]["thinking"] == "r"
    assert request.capture.features == {"thinking display summarized": "mapped"}


def test_omitted_thinking_streams_only_its_signature() -> None:
    request = anthropic(thinking={"type": "adaptive", "display": "omitted"})
    frames = ANTHROPIC.render_stream(Completion("c", "m", "ok", reasoning="why"), request)
    events = [orjson.loads(f.split(b"data: ", 1)[1]) for f in frames]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta" and e["index"] == 0]
    assert [d["type"] for d in deltas] == ["signature_delta"]
    assert decode_reasoning(deltas[0]["signature"]) == "why"


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"thinking": {"type": "on"}}, "thinking.type must be enabled, adaptive or disabled"),
        ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "budget_tokens"),
        ({"thinking": {"type": "adaptive", "display": "full"}}, "thinking.display"),
        ({"output_config": {"effort": "extreme"}}, "output_config.effort must be one of"),
    ],
)
def test_malformed_anthropic_reasoning_fields_are_a_400(extra: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        anthropic(**extra)


# --- OpenAI reasoning.effort / reasoning_effort, Gemini thinkingConfig ------------------------


@pytest.mark.parametrize(
    ("word", "controls"),
    [
        ("none", ReasoningControls(switch=ReasoningSwitch("reasoning.effort none", False))),
        (
            "minimal",
            ReasoningControls(effort=ReasoningEffort("reasoning.effort", "minimal", "low")),
        ),
        (
            "medium",
            ReasoningControls(effort=ReasoningEffort("reasoning.effort", "medium", "medium")),
        ),
        ("xhigh", ReasoningControls(effort=ReasoningEffort("reasoning.effort", "xhigh", "high"))),
    ],
)
def test_openai_effort_words(word: str, controls: ReasoningControls) -> None:
    body = {"model": "m", "input": "hi", "reasoning": {"effort": word, "summary": "auto"}}
    assert RESPONSES.parse_request(body, RequestContext("/v1/responses")).reasoning == controls
    chat = {"model": "m", "messages": [USER], "reasoning_effort": word}
    renamed = CHAT.parse_request(chat, RequestContext("/v1/chat/completions")).reasoning
    assert renamed.switch == (
        None if controls.switch is None else ReasoningSwitch("reasoning_effort none", False)
    )
    assert (renamed.effort and renamed.effort.level) == (controls.effort and controls.effort.level)


def test_unknown_openai_effort_words_are_a_400() -> None:
    with pytest.raises(InvalidRequest, match=r"reasoning\.effort must be one of"):
        RESPONSES.parse_request(
            {"input": "hi", "reasoning": {"effort": "max"}}, RequestContext("/v1/responses")
        )
    with pytest.raises(InvalidRequest, match="reasoning_effort must be one of"):
        CHAT.parse_request(
            {"messages": [USER], "reasoning_effort": 3}, RequestContext("/v1/chat/completions")
        )


@pytest.mark.parametrize(
    ("thinking", "controls"),
    [
        (
            {"thinkingBudget": 0},
            ReasoningControls(ReasoningSwitch("thinkingConfig.thinkingBudget 0", False)),
        ),
        (
            {"thinking_budget": -1},
            ReasoningControls(ReasoningSwitch("thinkingConfig.thinkingBudget -1", True)),
        ),
        (
            {"thinkingLevel": "low"},
            ReasoningControls(effort=ReasoningEffort("thinkingConfig.thinkingLevel", "low", "low")),
        ),
        ({"thinkingLevel": "THINKING_LEVEL_UNSPECIFIED"}, ReasoningControls()),
        ({"includeThoughts": False}, ReasoningControls()),
    ],
)
def test_gemini_thinking_config(thinking: dict[str, Any], controls: ReasoningControls) -> None:
    assert gemini(thinking).reasoning == controls


@pytest.mark.conformance(
    feature="reasoning omitted from the reply (display omitted, includeThoughts false)",
    api="google",
    status="supported",
)
def test_gemini_thoughts_left_out_still_ride_in_the_signature() -> None:
    request = gemini({"includeThoughts": False})
    reply = GOOGLE.render_response(Completion("c", "m", "ok", reasoning="why"), request)
    (part,) = reply["candidates"][0]["content"]["parts"]
    assert part["text"] == "ok" and "thoughtSignature" in part


@pytest.mark.parametrize(
    "thinking", [{"thinkingBudget": -2}, {"thinkingLevel": "EXTREME"}, {"includeThoughts": "yes"}]
)
def test_malformed_gemini_thinking_config_is_a_400(thinking: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest, match="thinkingConfig"):
        gemini(thinking)


# --- Anthropic context_management, tool search, defer_loading ---------------------------------


def _signed_turns() -> list[dict[str, Any]]:
    """Three assistant turns with reasoning, as Claude Code sends them back."""
    messages: list[dict[str, Any]] = [USER]
    for n in range(3):
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": f"thought {n}", "signature": "x"},
                    {"type": "text", "text": f"answer {n}"},
                ],
            }
        )
        messages.append({"role": "user", "content": f"more {n}"})
    return messages


def _kept_reasoning(request: NormalizedRequest) -> list[str | None]:
    return [m.get("reasoning") for m in request.messages if m["role"] == "assistant"]


@pytest.mark.conformance(
    feature="context_management clear_thinking", api="anthropic", status="supported"
)
@pytest.mark.parametrize(
    ("keep", "kept"),
    [
        ("all", ["thought 0", "thought 1", "thought 2"]),  # what Claude Code sends
        ({"type": "thinking_turns", "value": 2}, [None, "thought 1", "thought 2"]),
        (None, [None, None, "thought 2"]),  # the API's default: the last turn's
    ],
)
def test_clear_thinking_is_applied_to_the_history(keep: Any, kept: list[str | None]) -> None:
    edit: dict[str, Any] = {"type": "clear_thinking_20251015"}
    if keep is not None:
        edit["keep"] = keep
    request = anthropic(messages=_signed_turns(), context_management={"edits": [edit]})
    assert _kept_reasoning(request) == kept
    assert request.capture.features["context_management clear_thinking_20251015"] == "honoured"
    cleared = kept.count(None)
    notes = [n for n in request.capture.notes if "cleared the reasoning" in n]
    assert notes == (
        [
            f"context_management clear_thinking_20251015: cleared the reasoning of {cleared} earlier assistant turn(s)"
        ]
        if cleared
        else []
    )


@pytest.mark.conformance(
    feature="context_management clear_tool_uses", api="anthropic", status="refused"
)
@pytest.mark.parametrize("kind", ["clear_tool_uses_20250919", "compact_20260112"])
def test_token_triggered_context_edits_are_refused_by_name(kind: str) -> None:
    edits = [
        {"type": "clear_thinking_20251015", "keep": "all"},
        {"type": kind, "trigger": {"type": "input_tokens", "value": 30000}},
    ]
    with pytest.raises(InvalidRequest, match=f"edits\\[1\\]: the '{kind}' context edit"):
        anthropic(context_management={"edits": edits})


@pytest.mark.parametrize(
    "management",
    [
        "clear",
        {"edits": "clear"},
        {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "tool_uses", "value": 1}}]},
        {
            "edits": [
                {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 0}}
            ]
        },
    ],
)
def test_malformed_context_management_is_a_400(management: Any) -> None:
    with pytest.raises(InvalidRequest, match="context_management"):
        anthropic(context_management=management)


@pytest.mark.conformance(feature="tool search tools", api="anthropic", status="refused")
@pytest.mark.parametrize(
    "kind", ["tool_search_tool_regex_20251119", "tool_search_tool_bm25_20251119"]
)
def test_tool_search_tools_are_refused_by_name(kind: str) -> None:
    with pytest.raises(InvalidRequest, match=f"server tool '{kind}'"):
        anthropic(tools=[{"type": kind, "name": "tool_search"}])


@pytest.mark.conformance(feature="defer_loading", api="anthropic", status="mapped")
def test_deferred_tools_are_declared_up_front_on_the_record() -> None:
    tools = [
        {"name": "read", "input_schema": {"type": "object"}},
        {"name": "mcp__db__query", "input_schema": {"type": "object"}, "defer_loading": True},
    ]
    request = anthropic(tools=tools)
    assert [t["function"]["name"] for t in request.tools] == ["read", "mcp__db__query"]
    assert request.capture.features == {"defer_loading": "mapped"}
    assert request.capture.notes == [
        "defer_loading: tool 'mcp__db__query' is declared up front (no tool search here)"
    ]
    with pytest.raises(InvalidRequest, match="defer_loading must be a boolean"):
        anthropic(tools=[{"name": "x", "defer_loading": "yes"}])


# --- tools Chat Completions used to drop, legacy function_call ---------------------------------


@pytest.mark.conformance(feature="custom tools", api="openai_chat", status="refused")
def test_a_chat_custom_tool_is_refused_by_name_not_dropped() -> None:
    tool = {"type": "custom", "custom": {"name": "apply_patch", "format": {"type": "text"}}}
    body = {"messages": [USER], "tools": [tool]}
    with pytest.raises(InvalidRequest, match="tools\\[0\\]: 'custom' tools are not supported"):
        CHAT.parse_request(body, RequestContext("/v1/chat/completions"))


@pytest.mark.conformance(feature="custom tools", api="openai_responses", status="mapped")
def test_a_responses_custom_tool_is_a_function_of_one_string() -> None:
    body = {"input": "hi", "tools": [{"type": "custom", "name": "apply_patch"}]}
    (tool,) = RESPONSES.parse_request(body, RequestContext("/v1/responses")).tools
    assert tool["function"]["parameters"]["required"] == ["input"]


@pytest.mark.conformance(
    feature="legacy function_call named (gateway rendering)", api="openai_chat", status="mapped"
)
def test_a_named_legacy_function_call_is_enforced_as_a_named_tool_choice() -> None:
    body = {
        "messages": [USER],
        "functions": [{"name": "shell"}, {"name": "read"}],
        "function_call": {"name": "read"},
    }
    request = CHAT.parse_request(body, RequestContext("/v1/chat/completions"))
    flags: list[str] = []
    hermes = get_tool_parser("hermes")
    enforce_tool_choice(request, hermes.call_pattern, "hermes", "structured_outputs.regex", flags)
    assert request.capture.features["tool_choice named"] == "mapped"
    pattern = re.compile(str(request.forced_call_pattern))
    read = '<tool_call>\n{"name": "read", "arguments": {}}\n</tool_call>'
    assert pattern.fullmatch(read) and not pattern.fullmatch(read.replace("read", "shell"))


def test_claude_codes_own_fields_parse_and_change_no_history() -> None:
    """What Claude Code puts on every request: thinking adaptive with display omitted, an
    effort, and clear_thinking keeping all. Served, never refused, each on the record."""
    turns = _signed_turns()
    plain = anthropic(messages=turns)
    request = anthropic(
        messages=turns,
        thinking={"type": "adaptive", "display": "omitted"},
        output_config={"effort": "high"},
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    )
    assert request.messages == plain.messages
    assert request.reasoning == ReasoningControls(
        switch=ReasoningSwitch("thinking adaptive", True),
        effort=ReasoningEffort("output_config.effort", "high", "high"),
    )
    assert request.capture.features == {
        "context_management clear_thinking_20251015": "honoured",
        "thinking display omitted": "honoured",
    }
