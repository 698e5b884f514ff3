"""Codex's MCP tools (``namespace`` entries) through the openai SDK, in both render modes.

The model sees each namespaced function under its flat name (``mcp__probe__lookup``), the SDK
gets the call back with ``name`` and ``namespace`` apart, and the replayed call (with its MCP
output as content items) renders as the name the model sampled: under gateway rendering the
second prompt extends the first call's prompt and sampled ids exactly.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from polar.engines.scripted import ScriptedReply
from polar.trajectory.registry import create_builder

pytestmark = pytest.mark.slow

PROBE = {
    "type": "namespace",
    "name": "mcp__probe",
    "description": "Tools in the mcp__probe namespace.",
    "tools": [
        {
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
    ],
}
FLAT = "mcp__probe__lookup"


def _modes() -> list[Any]:
    return [
        pytest.param(
            mode,
            stream,
            marks=pytest.mark.conformance(
                feature=f"namespace tools ({mode} rendering)",
                api="openai_responses",
                status="mapped",
            ),
            id=f"{mode}-{'stream' if stream else 'whole'}",
        )
        for mode in ("engine", "gateway")
        for stream in (False, True)
    ]


@pytest.mark.parametrize(
    ("noncanonical_gateway", "stream"), _modes(), indirect=["noncanonical_gateway"]
)
def test_namespaced_calls_round_trip(noncanonical_gateway: Any, stream: bool) -> None:
    gateway = noncanonical_gateway
    gateway.reset()
    session = gateway.new_session()
    client = openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key, max_retries=0)
    gateway.script(
        ScriptedReply(tool_calls=[(FLAT, {"word": "polar"})]), ScriptedReply(content="Found it.")
    )
    items: list[Any] = [{"role": "user", "content": "Look up polar."}]
    kwargs: dict[str, Any] = {"model": "m", "tools": [PROBE], "store": False}
    if stream:
        with client.responses.stream(input=items, **kwargs) as events:
            first = events.get_final_response()
    else:
        first = client.responses.create(input=items, **kwargs)
    (item,) = first.output
    assert (item.type, item.name, item.namespace) == ("function_call", "lookup", "mcp__probe")
    assert json.loads(item.arguments) == {"word": "polar"}
    items += [item.model_dump(exclude_none=True)]
    output = [{"type": "input_text", "text": "polar: of the poles"}]
    items.append({"type": "function_call_output", "call_id": item.call_id, "output": output})
    second = client.responses.create(input=items, **kwargs)
    assert second.output_text == "Found it."

    first_record, second_record = gateway.records(session.key)
    assert first_record.dropped_tools == []
    assert "feature namespace tools: mapped" in first_record.notes
    tools = first_record.upstream_request["tools"]
    assert [t["function"]["name"] for t in tools] == [FLAT]
    sent = second_record.upstream_request["messages"]
    assert sent[1]["tool_calls"][0]["function"]["name"] == FLAT
    assert sent[2]["content"] == "polar: of the poles"
    if gateway.render_mode == "gateway":
        head = first_record.prompt_ids + first_record.sampled_ids
        assert second_record.prompt_ids[: len(head)] == head
        (trace,) = create_builder("prefix_merging").build([first_record, second_record]).traces
        assert trace.prompt_ids == first_record.prompt_ids
    gateway.reset()
