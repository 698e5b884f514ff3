"""Side-call rules: the calls a harness makes that are not agent turns get a tag."""

from __future__ import annotations

import pytest

from polar.harnesses.registry import side_call_tag
from polar.providers.types import NormalizedRequest


def request(system: str | list[dict[str, str]], *, stream: bool = True) -> NormalizedRequest:
    return NormalizedRequest(
        provider="openai_chat",
        model="m",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
        stream=stream,
    )


AGENT_PROMPT = "You are an interactive agent that helps users with software engineering tasks."


@pytest.mark.parametrize(
    ("harness", "system", "tag"),
    [
        (
            "opencode",
            "You are a title generator. You output ONLY a thread title.",
            "side_call:title",
        ),
        ("opencode", AGENT_PROMPT, None),
        (
            "qwen_code",
            "You are now acting as the managed memory extraction subagent for an AI coding assistant.",
            "side_call:memory",
        ),
        (
            "qwen_code",
            "You are performing a managed memory dream \u2014 a pass",
            "side_call:memory",
        ),
        ("qwen_code", AGENT_PROMPT, None),
        (
            "gemini_cli",
            "You are a specialized Task Routing AI. Your sole function",
            "side_call:routing",
        ),
        (
            "gemini_cli",
            "You are a diagnostic agent that determines whether a conversational AI assistant is stuck",
            "side_call:loop_detection",
        ),
        (
            "gemini_cli",
            "You are a specialized system component responsible for distilling chat history into a structured XML <state_snapshot>.",
            "side_call:compression",
        ),
        ("gemini_cli", AGENT_PROMPT, None),
        ("codex", "You are a title generator.", None),
        ("pi", "You are a title generator.", None),
    ],
)
def test_side_calls_are_recognised_by_system_prompt(
    harness: str, system: str, tag: str | None
) -> None:
    assert side_call_tag(harness, request(system), {}) == tag


def test_system_prompt_given_as_parts_is_matched() -> None:
    parts = [
        {"type": "text", "text": "Intro."},
        {"type": "text", "text": "You are a title generator."},
    ]
    assert side_call_tag("opencode", request(parts), {}) == "side_call:title"


def test_claude_code_non_streamed_call_is_a_side_call() -> None:
    assert side_call_tag("claude_code", request(AGENT_PROMPT, stream=True), {}) is None
    assert (
        side_call_tag("claude_code", request(AGENT_PROMPT, stream=False), {})
        == "side_call:non_streaming"
    )
