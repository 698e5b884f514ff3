"""OpenAI Responses over a WebSocket, with a real WebSocket client against a live gateway: each
``response.create`` frame is the streaming POST it stands for (same capture, rendering, state and
key), a Codex-style session (warm-up, empty delta, ``store: false``, previous_response_id) is
captured exactly and merges into one trace, and bad keys and frames are refused in words."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from polar.engines.scripted import ScriptedReply
from polar.engines.scripted import logged_tokens as engine_tokens
from polar.schemas.flags import FLAG_WEBSOCKET
from polar.trajectory.registry import create_builder

API = "openai_responses"
TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "description": "Run a command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        },
    }
]
COMMON = {"model": "gpt-5-codex", "instructions": "You are Codex.", "tools": TOOLS, "store": False}


def ws_url(base_url: str) -> str:
    return base_url.replace("http://", "ws://", 1) + "/v1/responses"


def open_socket(gateway: Any, key: str) -> ClientConnection:
    return connect(
        ws_url(gateway.base_url),
        additional_headers={"Authorization": f"Bearer {key}"},
        open_timeout=10,
    )


def turn(socket: ClientConnection, **frame: Any) -> list[dict[str, Any]]:
    """Send one response.create; its events up to the last (completed, failed or error)."""
    socket.send(json.dumps({"type": "response.create", **frame}))
    events = []
    while True:
        event = json.loads(socket.recv(timeout=30))
        events.append(event)
        if event["type"] in ("response.completed", "response.failed", "error"):
            return events


@pytest.mark.conformance(feature="websocket mode", api=API, status="supported")
def test_a_codex_style_session_is_captured_exactly_and_merges(noncanonical_gateway, tokenizer):
    gateway = noncanonical_gateway
    gateway.reset()
    session = gateway.new_session()
    gateway.script(
        ScriptedReply(content="", reasoning="run ls", tool_calls=[("shell", {"command": ["ls"]})]),
        ScriptedReply(content="Done: a.txt"),
    )
    with open_socket(gateway, session.key) as socket:
        warm = turn(socket, input="list files", generate=False, **COMMON)
        assert [e["type"] for e in warm] == ["response.created", "response.completed"]
        assert warm[-1]["response"]["output"] == []
        # Codex then sends an empty delta on the warm-up's id: the first turn itself.
        first = turn(socket, input=[], previous_response_id=warm[-1]["response"]["id"], **COMMON)
        done = first[-1]["response"]
        assert done["status"] == "completed" and done["store"] is False
        call = next(o for o in done["output"] if o["type"] == "function_call")
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt"}
        second = turn(socket, input=[output], previous_response_id=done["id"], **COMMON)
        assert second[-1]["response"]["output"][-1]["content"][0]["text"] == "Done: a.txt"
        assert second[-1]["response"]["previous_response_id"] == done["id"]

    records = gateway.records(session.key)
    assert len(records) == 2  # the warm-up sampled nothing and is not a call
    assert all(FLAG_WEBSOCKET in record.flags for record in records)
    sent = records[1].upstream_request["messages"]
    assert sent[0] == {"role": "system", "content": "You are Codex."}
    assert sent[1] == {"role": "user", "content": "list files"}
    assert sent[2]["reasoning"] == "run ls"
    assert sent[3] == {"role": "tool", "tool_call_id": call["call_id"], "content": "a.txt"}
    for record, reply in zip(records, gateway.engine_log, strict=True):
        assert (record.prompt_ids, record.sampled_ids, record.logprobs) == engine_tokens(reply)
    if gateway.render_mode == "gateway":
        before, after = records
        whole = before.prompt_ids + before.sampled_ids
        assert after.prompt_ids[: len(whole)] == whole
    meta = create_builder("prefix_merging").build(records).metadata
    assert meta["context_exact_calls"] == meta["merged_calls"]
    if gateway.render_mode == "gateway":
        assert meta["num_traces"] == 1 and meta["merged_calls"] == 1, meta
    # store: false replies lived as long as the socket (forgotten as its close is handled).
    assert _gone(gateway, session.key, done["id"])


def _gone(gateway: Any, key: str, reply_id: str) -> bool:
    for _ in range(50):
        reply = httpx.get(
            f"{gateway.base_url}/v1/responses/{reply_id}",
            headers={"Authorization": f"Bearer {key}"},
        )
        if reply.status_code == 404:
            return True
        time.sleep(0.05)
    return False


def test_a_stored_reply_continues_over_http_too(live_gateway):
    session = live_gateway.new_session()
    live_gateway.script(ScriptedReply(content="one"), ScriptedReply(content="two"))
    with open_socket(live_gateway, session.key) as socket:
        first = turn(socket, model="gpt-5", input="count")[-1]["response"]
    assert first["store"] is True
    reply = httpx.post(
        f"{live_gateway.base_url}/v1/responses",
        headers={"Authorization": f"Bearer {session.key}"},
        json={"model": "gpt-5", "input": "more", "previous_response_id": first["id"]},
    )
    assert reply.status_code == 200, reply.text
    over_socket, over_http = live_gateway.records(session.key)
    assert [m["content"] for m in over_http.upstream_request["messages"]] == [
        "count",
        "one",
        "more",
    ]
    assert FLAG_WEBSOCKET in over_socket.flags and FLAG_WEBSOCKET not in over_http.flags


def test_an_unknown_key_is_refused_at_the_upgrade(live_gateway):
    with pytest.raises(InvalidStatus) as refused:
        open_socket(live_gateway, "not-a-session")
    assert refused.value.response.status_code == 401
    assert "session key" in refused.value.response.body.decode()
    assert not live_gateway.engine_log


def test_only_the_responses_path_upgrades(live_gateway):
    session = live_gateway.new_session()
    with pytest.raises(InvalidStatus) as refused:
        connect(
            live_gateway.base_url.replace("http://", "ws://") + "/v1/chat/completions",
            additional_headers={"Authorization": f"Bearer {session.key}"},
        )
    assert refused.value.response.status_code == 404


def test_bad_frames_get_error_events_and_the_socket_stays_open(live_gateway):
    session = live_gateway.new_session()
    live_gateway.script(ScriptedReply(content="still here"))
    with open_socket(live_gateway, session.key) as socket:
        socket.send("{not json")
        bad = json.loads(socket.recv(timeout=10))
        assert bad["type"] == "error" and bad["status"] == 400
        assert "not valid JSON" in bad["error"]["message"]
        socket.send(json.dumps({"type": "session.update"}))
        assert "unsupported client event" in json.loads(socket.recv(timeout=10))["error"]["message"]
        socket.send(
            json.dumps({"type": "response.processed", "response_id": "resp_x"})
        )  # no answer
        unknown = turn(socket, model="gpt-5", input="hi", previous_response_id="resp_nope")
        assert unknown[-1]["status"] == 400
        assert "Previous response with id 'resp_nope'" in unknown[-1]["error"]["message"]
        empty = turn(socket, model="gpt-5", input=[])
        assert empty[-1]["type"] == "error" and empty[-1]["status"] == 400
        good = turn(socket, model="gpt-5", input="hi")
        assert good[-1]["type"] == "response.completed"
    assert len(live_gateway.records(session.key)) == 1


def test_stream_events_are_the_sse_streams_own(live_gateway):
    """The same request over SSE and over the socket: the same event sequence."""
    session = live_gateway.new_session()
    live_gateway.script(ScriptedReply(content="same", reasoning="think"))
    live_gateway.script(ScriptedReply(content="same", reasoning="think"))
    body = {"model": "gpt-5", "input": "hi"}
    with httpx.stream(
        "POST",
        f"{live_gateway.base_url}/v1/responses",
        headers={"Authorization": f"Bearer {session.key}"},
        json={**body, "stream": True},
    ) as reply:
        lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
    over_http = [json.loads(line[6:])["type"] for line in lines]
    with open_socket(live_gateway, session.key) as socket:
        over_socket = [event["type"] for event in turn(socket, **body)]
    assert over_socket == over_http
    assert list(itertools.islice(over_socket, 2)) == ["response.created", "response.in_progress"]
