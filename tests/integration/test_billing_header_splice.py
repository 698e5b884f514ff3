"""Claude Code's per-request billing line under gateway rendering: stripped by the Anthropic
adapter before rendering, so a tool step whose billing line changed still extends the sampled
turn exactly (the splice compares the whole history, system prompt included, and would
render whole if the line reached it)."""

from __future__ import annotations

from typing import Any

import httpx

from polar.engines.scripted import ScriptedReply
from polar.schemas.flags import FLAG_SPLICED

TOOLS = [{"name": "Bash", "input_schema": {"type": "object", "properties": {}}}]


def _post(gateway: Any, key: str, billing: str, messages: list[Any]) -> dict[str, Any]:
    body = {
        "model": "claude-sonnet",
        "max_tokens": 200,
        "system": [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=1; cch={billing}"},
            {"type": "text", "text": "You are Claude Code."},
        ],
        "messages": messages,
        "tools": TOOLS,
    }
    reply = httpx.post(
        f"{gateway.base_url}/v1/messages",
        json=body,
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
    )
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def test_a_changed_billing_line_still_splices_the_tool_step(live_gateway: Any) -> None:
    session = live_gateway.new_session()
    live_gateway.script(
        ScriptedReply(content="", tool_calls=[("Bash", {"command": "ls"})]),
        ScriptedReply(content="Done."),
    )
    user = {"role": "user", "content": "List the files."}
    first = _post(live_gateway, session.key, "aaa", [user])
    (call,) = [b for b in first["content"] if b["type"] == "tool_use"]
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": "a.txt"}
    history = [user, {"role": "assistant", "content": first["content"]}]
    _post(live_gateway, session.key, "bbb", [*history, {"role": "user", "content": [result]}])
    records = live_gateway.records(session.key)
    assert [r.notes for r in records] == [
        ["stripped: x-anthropic-billing-header: cc_version=1; cch=aaa"],
        ["stripped: x-anthropic-billing-header: cc_version=1; cch=bbb"],
    ]
    assert FLAG_SPLICED in records[1].flags
    head = records[0].prompt_ids + records[0].sampled_ids
    assert records[1].prompt_ids[: len(head)] == head
