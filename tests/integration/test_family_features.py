"""What a family's format cannot express is served within it or refused by name (issue 36).

Llama 3's template renders one tool call per assistant turn and raises on more ("This model
only supports single tool-calls at once!"). A model may still sample two calls
(``{...}; {...}``, which its parser reads). Replying with both would hand the harness a turn
its next request carries back, and every later prompt of the session would be a 400 from the
template. The gateway reads the family's ``parallel_tool_calls`` feature: the reply keeps the
first call (flagged, as with ``parallel_tool_calls: false``) and the session goes on; a
history with several calls in one turn is refused by name. Images for a text-only family get
a 400 that says it is not multimodal, in the caller's provider shape.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from polar.engines.scripted import ScriptedReply
from polar.rendering.families.registry import get_family
from polar.schemas.flags import FLAG_PARALLEL_CALLS_CUT, FLAG_RENDERED_WHOLE

from .family_kit import FamilyBackend, ServedGateway, family_tokenizer

SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": SCHEMA}}]
# What a Llama 3 model samples for two calls in one turn: its parser reads both.
TWO_CALLS = (
    '<|python_tag|>{"name": "shell", "parameters": {"command": "ls"}}; '
    '{"name": "shell", "parameters": {"command": "pwd"}}'
)


@pytest.fixture(scope="module")
def llama3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedGateway]:
    backend = FamilyBackend(get_family("llama3"), family_tokenizer("llama3"))
    with ServedGateway(backend, tmp_path_factory.mktemp("llama3") / "c.db") as gateway:
        yield gateway


def _client(gateway: ServedGateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0)


def test_a_llama3_turn_with_two_calls_replies_with_one_and_the_session_goes_on(
    llama3: ServedGateway,
) -> None:
    session = llama3.new_session()
    client = _client(llama3, session.key)
    llama3.script(ScriptedReply(content=TWO_CALLS), ScriptedReply(content="Done."))
    messages: list[Any] = [{"role": "user", "content": "Where am I?"}]
    first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    calls = first.choices[0].message.tool_calls or []
    assert [json.loads(c.function.arguments) for c in calls] == [{"command": "ls"}]
    assert first.choices[0].finish_reason == "tool_calls"
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": calls[0].id, "content": "a.txt"},
    ]
    second = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "Done."
    cut, after = llama3.records(session.key)
    assert FLAG_PARALLEL_CALLS_CUT in cut.flags
    assert any("model family llama3 renders one call per turn" in n for n in cut.notes)
    # The second prompt renders the one-call history the harness sent, not the sampled ids.
    assert f"{FLAG_RENDERED_WHOLE}:unknown_assistant_turn" in after.flags


def test_a_history_with_two_calls_in_one_turn_is_refused_by_name(llama3: ServedGateway) -> None:
    session = llama3.new_session()
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": "shell", "arguments": a}}
        for i, a in enumerate(('{"command": "ls"}', '{"command": "pwd"}'))
    ]
    messages: list[Any] = [
        {"role": "user", "content": "Where am I?"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_0", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "call_1", "content": "/work"},
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        _client(llama3, session.key).chat.completions.create(
            model="m", messages=messages, tools=TOOLS
        )
    assert "model family llama3 renders one tool call per assistant turn" in str(refused.value)
    assert "messages[1]" in str(refused.value)


def test_an_image_for_llama3_says_it_is_not_multimodal(llama3: ServedGateway) -> None:
    session = llama3.new_session()
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    content = [{"type": "text", "text": "What is this?"}, image]
    messages: list[Any] = [{"role": "user", "content": content}]
    with pytest.raises(openai.BadRequestError) as refused:
        _client(llama3, session.key).chat.completions.create(model="m", messages=messages)
    assert "model family llama3 is not a multimodal model" in str(refused.value)


def test_a_forced_call_on_llama3_is_one_call(llama3: ServedGateway) -> None:
    """tool_choice required: the regex the engine gets allows one call, never ``{...}; {...}``
    (parallel_tool_calls left at its default)."""
    session = llama3.new_session()
    one = '{"name": "shell", "parameters": {"command": "ls"}}'
    llama3.script(ScriptedReply(content=one))
    messages: list[Any] = [{"role": "user", "content": "Where am I?"}]
    reply = _client(llama3, session.key).chat.completions.create(
        model="m", messages=messages, tools=TOOLS, tool_choice="required"
    )
    assert len(reply.choices[0].message.tool_calls or []) == 1
    pattern = re.compile(llama3.backend.requests[-1]["structured_outputs"]["regex"])
    assert pattern.fullmatch(one)
    assert not pattern.fullmatch(TWO_CALLS.removeprefix("<|python_tag|>"))
