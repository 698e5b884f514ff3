"""Codex's MCP tools: ``namespace`` tool entries flattened for the model, calls named back.

The request shapes are what the pinned Codex (0.169.0) sent with one stdio MCP server
configured (``[mcp_servers.probe]``), recorded from the wire.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from polar.errors import InvalidRequest
from polar.providers.openai_responses_input import flat_tool_name
from polar.providers.types import ToolCall

from .test_openai_responses import FakeGateway, answer, call, create_kwargs, parse

LOOKUP = {
    "type": "function",
    "name": "lookup",
    "description": "Look a word up.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"word": {"type": "string"}},
        "required": ["word"],
    },
}
# As Codex 0.169.0 sends an MCP server's tools (its default namespace description included).
PROBE = {
    "type": "namespace",
    "name": "mcp__probe",
    "description": "Tools in the mcp__probe namespace.",
    "tools": [LOOKUP],
}
EXEC = {"type": "function", "name": "exec_command", "parameters": {"type": "object"}}
FLAT = "mcp__probe__lookup"
LOOKUP_CALL = ToolCall(id="call_m1", name=FLAT, arguments='{"word": "polar"}')


def test_namespace_tools_are_flattened_for_the_model() -> None:
    request = parse({"input": "x", "tools": [EXEC, PROBE]})
    assert [t["function"]["name"] for t in request.tools] == ["exec_command", FLAT]
    assert request.tools[1]["function"]["description"] == "Look a word up."
    assert request.tools[1]["function"]["parameters"] == LOOKUP["parameters"]
    assert request.dropped_tools == []
    assert "feature namespace tools: mapped" in request.capture.record_notes()


@pytest.mark.parametrize(
    ("namespace", "name", "flat"),
    [
        ("mcp__probe", "lookup", "mcp__probe__lookup"),
        ("mcp__probe__", "lookup", "mcp__probe__lookup"),  # older Codex: a trailing delimiter
        ("crm", "_find", "crm__find"),
    ],
)
def test_flat_names_join_as_codex_flattens_them(namespace: str, name: str, flat: str) -> None:
    assert flat_tool_name(namespace, name) == flat


@pytest.mark.parametrize("stream", [False, True])
def test_calls_come_back_with_name_and_namespace_apart(stream: bool) -> None:
    gateway = FakeGateway(answer(tool_calls=[LOOKUP_CALL], finish_reason="tool_calls"))
    client = gateway.client()
    kwargs = create_kwargs(tools=[EXEC, PROBE])
    if stream:
        events = list(client.responses.create(**kwargs, stream=True))
        added = [e.item for e in events if e.type == "response.output_item.added"]
        assert (added[0].name, added[0].namespace) == ("lookup", "mcp__probe")
        output = events[-1].response.output
    else:
        output = client.responses.create(**kwargs).output
    (item,) = output
    assert (item.type, item.name, item.namespace, item.call_id) == (
        "function_call",
        "lookup",
        "mcp__probe",
        "call_m1",
    )
    assert json.loads(item.arguments) == {"word": "polar"}


def test_a_plain_function_call_carries_no_namespace() -> None:
    shell = ToolCall(id="c", name="exec_command", arguments="{}")
    response = (
        FakeGateway(answer(tool_calls=[shell]))
        .client()
        .responses.create(**create_kwargs(tools=[EXEC, PROBE]))
    )
    assert response.output[0].namespace is None


def test_a_replayed_namespaced_call_renders_as_the_name_the_model_sampled() -> None:
    """Codex replays the call with ``namespace`` and its MCP output as content items: the
    history holds the flat name (the tokens sampled) and the output's texts joined."""
    gateway = FakeGateway(answer(tool_calls=[LOOKUP_CALL], finish_reason="tool_calls"))
    client = gateway.client()
    first = client.responses.create(**create_kwargs(tools=[EXEC, PROBE]))
    history: list[Any] = [{"role": "user", "content": "run the tests"}]
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append(
        {
            "type": "function_call_output",
            "call_id": "call_m1",
            "output": [
                {"type": "input_text", "text": "polar: of the poles"},
                {"type": "input_text", "text": "(1 entry)"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
            ],
        }
    )
    client.responses.create(**create_kwargs(input=history, tools=[EXEC, PROBE]))
    assert gateway.requests[1].messages[2:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("call_m1", FLAT, '{"word": "polar"}')],
        },
        {"role": "tool", "tool_call_id": "call_m1", "content": "polar: of the poles\n(1 entry)"},
        # a tool result's image follows as a user turn, as for every chat-shaped tool result
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
        },
    ]


def test_a_namespaced_custom_tool_calls_back_as_a_custom_tool_call() -> None:
    patch = {"type": "custom", "name": "apply", "description": "Apply a patch."}
    tools = [{"type": "namespace", "name": "edit", "description": "", "tools": [patch]}]
    turn = [ToolCall(id="c1", name="edit__apply", arguments='{"input": "*** Begin"}')]
    response = (
        FakeGateway(answer(tool_calls=turn)).client().responses.create(**create_kwargs(tools=tools))
    )
    item = response.output[0]
    assert (item.type, item.name, item.namespace, item.input) == (
        "custom_tool_call",
        "apply",
        "edit",
        "*** Begin",
    )
    replay = parse({"input": [item.model_dump(exclude_none=True)], "tools": tools})
    assert replay.messages[0]["tool_calls"][0]["function"]["name"] == "edit__apply"


def test_tool_choice_may_name_a_namespaced_function() -> None:
    choice = {"type": "function", "name": "lookup", "namespace": "mcp__probe"}
    request = parse({"input": "x", "tools": [PROBE], "tool_choice": choice})
    assert request.tool_choice == {"type": "function", "function": {"name": FLAT}}


@pytest.mark.parametrize(
    ("tools", "match"),
    [
        ([{"type": "function", "name": FLAT}, PROBE], "both named 'mcp__probe__lookup'"),
        ([PROBE, {**PROBE, "name": "mcp__probe__"}], "both named 'mcp__probe__lookup'"),
        (
            [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}],
            "only function and custom tools may be namespaced",
        ),
        ([{"type": "namespace", "tools": [LOOKUP]}], "namespace tool needs a string 'name'"),
        ([{"type": "namespace", "name": "n", "tools": "x"}], "tools of namespace 'n'"),
    ],
)
def test_ambiguous_or_malformed_namespaces_are_refused_by_name(
    tools: list[Any], match: str
) -> None:
    with pytest.raises(InvalidRequest, match=match):
        parse({"input": "x", "tools": tools})
