"""Call ids a model repeats reach the harness unique and come back as the model's own (issue 36).

The pure mapping (:class:`SessionCallIds`), the store that keeps it per session, and a gateway
in front of a Kimi-format engine that samples ``functions.Bash:0`` every turn, over each API
that hands call ids to its client, restarted in the middle of the session.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from integration.family_kit import FamilyBackend, ServedGateway, family_tokenizer
from polar.capture.records import CaptureRecord
from polar.capture.store import CaptureStore
from polar.engines.scripted import Script, ScriptedReply
from polar.gateway.call_ids import SessionCallIds
from polar.rendering.families.registry import get_family
from polar.rendering.turns import SampledTurn, TurnBook, context_digest
from polar.schemas.flags import FLAG_SPLICED

REPEATED = "functions.Bash:0"


def test_an_id_the_session_was_given_is_issued_again_under_a_fresh_alias() -> None:
    ids = SessionCallIds()
    assert ids.issue([REPEATED]) == [REPEATED]
    assert ids.issue([REPEATED]) == [f"{REPEATED}_2"]
    # Twice in one reply, and again: every id the harness gets is new to the session.
    assert ids.issue([REPEATED, REPEATED]) == [f"{REPEATED}_3", f"{REPEATED}_4"]
    assert ids.issue(["call_abc"]) == ["call_abc"]
    assert [ids.model_id(f"{REPEATED}_{n}") for n in (2, 3, 4)] == [REPEATED] * 3


def test_an_alias_the_model_samples_itself_gets_an_alias_of_its_own() -> None:
    ids = SessionCallIds()
    ids.issue([REPEATED, REPEATED])
    (given,) = ids.issue([f"{REPEATED}_2"])
    assert given not in (REPEATED, f"{REPEATED}_2")
    assert ids.model_id(given) == f"{REPEATED}_2"
    assert ids.model_id(f"{REPEATED}_2") == REPEATED


def test_history_gets_the_models_own_ids_back_and_the_harness_objects_stay_as_sent() -> None:
    ids = SessionCallIds({REPEATED: REPEATED, f"{REPEATED}_2": REPEATED})
    call = {"id": f"{REPEATED}_2", "type": "function", "function": {"name": "Bash"}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"{REPEATED}_2", "content": "ok"},
        {"role": "tool", "tool_call_id": "call_unknown", "content": "ok"},
    ]
    model = ids.to_model(messages)
    assert model[1]["tool_calls"][0]["id"] == REPEATED
    assert model[2]["tool_call_id"] == REPEATED
    assert model[0] is messages[0] and model[3] is messages[3]  # nothing to change: as sent
    assert call["id"] == f"{REPEATED}_2" and messages[2]["tool_call_id"] == f"{REPEATED}_2"


def test_turns_that_share_a_call_id_are_told_apart_by_what_they_answered() -> None:
    """History names each call by the model's own id, so one id may stand for several sampled
    turns: a retry of an older call must splice onto the turn that answered its history."""
    book = TurnBook()
    older, newer = (
        SampledTurn(cid, array("i", [1]), array("i", [2]), digest, "<|im_end|>")
        for cid, digest in (("c1", b"history-1"), ("c2", b"history-2"))
    )
    for turn in (older, newer):
        book.add(turn, "", [REPEATED], has_tool_calls=True)
    message = {"role": "assistant", "tool_calls": [{"id": REPEATED}]}
    assert book.find(message, b"history-1") is older
    assert book.find(message, b"history-2") is newer
    assert book.find(message, b"changed") is newer  # the latest: its plan says history_changed


def test_calls_sent_back_without_ids_get_the_sampled_turns_own_ids_for_good() -> None:
    """Gemini callers answer by name, and their adapter makes ids up (``call_<turn>_<n>``):
    the last turn's become the model's own ids of the turn the gateway sampled, and stay so in
    every later request, after that turn has left the book too (its digest keeps matching)."""
    ids, book, tools = SessionCallIds(), TurnBook(keep=1), [{"type": "function"}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    made_up: set[str] = set()
    for n in range(3):
        made = f"call_{2 * n + 1}_0"
        made_up.add(made)
        function = {"name": "Bash", "arguments": json.dumps({"command": f"echo {n}"})}
        answered = ids.own_ids(messages, tools, made_up, book)  # what the sampled turn answered
        turn = SampledTurn(
            f"c{n}", array("i", [n]), array("i", [n]), context_digest(answered, tools), "<eot>"
        )
        book.add(turn, "", [REPEATED], has_tool_calls=True)
        book.add_calls(turn.completion_id, [{"function": function}])
        call = {"id": made, "type": "function", "function": function}
        messages = [
            *messages,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": made, "content": "ok"},
        ]
        own = ids.own_ids(messages, tools, made_up, book)
        assert [c["id"] for m in own for c in m.get("tool_calls") or []] == [REPEATED] * (n + 1)
        assert [m["tool_call_id"] for m in own if m["role"] == "tool"] == [REPEATED] * (n + 1)
        assert messages[-1]["tool_call_id"] == made  # the caller's objects stay as sent
    assert len(book) == 1
    # No recorded turn (a first call with pasted history): the made-up ids are all there is.
    assert SessionCallIds().own_ids(messages, tools, made_up, TurnBook()) == messages
    # A made-up id now standing for another call (the history was rewritten) is left alone.
    other = {**messages[1]["tool_calls"][0], "function": {"name": "Bash", "arguments": "{}"}}
    rewritten = [messages[0], {**messages[1], "tool_calls": [other]}, messages[2]]
    assert ids.own_ids(rewritten, tools, made_up, None) == rewritten


def _record(session: str, n: int, model_ids: list[str], given: list[str]) -> CaptureRecord:
    calls = [{"id": i, "type": "function", "function": {"name": "Bash"}} for i in model_ids]
    return CaptureRecord(
        completion_id=f"c{n}",
        session_id=session,
        provider="anthropic",
        model="m",
        engine="scripted",
        started_at=0.0,
        finished_at=0.0,
        upstream_request={"messages": []},
        response={"role": "assistant", "content": "", "tool_calls": calls},
        harness_call_ids=given,
        prompt_ids=[1, 2],
        sampled_ids=[3],
        logprobs=None,
        finish_reason="tool_calls",
    )


async def test_the_store_keeps_each_sessions_issued_ids_across_a_reopen(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path / "c.db")
    await store.append(_record("s1", 1, [REPEATED], [REPEATED]))
    await store.append(_record("s1", 2, [REPEATED], [f"{REPEATED}_2"]))
    await store.append(_record("s2", 3, [REPEATED], [REPEATED]))
    store.close()
    store = CaptureStore(tmp_path / "c.db")
    assert store.call_ids("s1") == {REPEATED: REPEATED, f"{REPEATED}_2": REPEATED}
    assert store.call_ids("s2") == {REPEATED: REPEATED}
    assert [r.harness_call_ids for r in store.records("s1")] == [[REPEATED], [f"{REPEATED}_2"]]
    await store.delete_session("s1")
    assert store.call_ids("s1") == {}
    store.close()


def test_a_record_whose_harness_ids_do_not_match_its_calls_is_refused() -> None:
    with pytest.raises(ValidationError, match="2 harness call ids for 1 tool calls"):
        _record("s", 1, [REPEATED], ["a", "b"])
    assert _record("s", 1, [REPEATED], []).call_id_pairs() == []  # a record from before them


# ---- a gateway over each API, in front of a model that repeats functions.Bash:0 -------------

BASH = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}
# One step of the history: (the id the harness was given, the command, the command's output).
Step = tuple[str, str, str]


@dataclass(frozen=True)
class Api:
    """How one provider API carries a tool session: the request, and the reply's call ids."""

    path: str
    body: Callable[[list[Step]], dict[str, Any]]
    call_ids: Callable[[dict[str, Any]], list[str]]


def _anthropic(steps: list[Step]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Run the commands."}]
    for call_id, command, output in steps:
        use = {"type": "tool_use", "id": call_id, "name": "Bash", "input": {"command": command}}
        result = {"type": "tool_result", "tool_use_id": call_id, "content": output}
        messages += [
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ]
    tool = {"name": "Bash", "description": "Run a command.", "input_schema": BASH}
    return {"model": "m", "max_tokens": 256, "tools": [tool], "messages": messages}


def _chat(steps: list[Step]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Run the commands."}]
    for call_id, command, output in steps:
        arguments = json.dumps({"command": command})
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": "Bash", "arguments": arguments},
        }
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": output},
        ]
    tool = {"type": "function", "function": {"name": "Bash", "parameters": BASH}}
    return {"model": "m", "max_tokens": 256, "tools": [tool], "messages": messages}


def _responses(steps: list[Step]) -> dict[str, Any]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "Run the commands."}]
    for call_id, command, output in steps:
        arguments = json.dumps({"command": command})
        items += [
            {"type": "function_call", "call_id": call_id, "name": "Bash", "arguments": arguments},
            {"type": "function_call_output", "call_id": call_id, "output": output},
        ]
    tool = {"type": "function", "name": "Bash", "parameters": BASH}
    return {"model": "m", "max_output_tokens": 256, "tools": [tool], "input": items, "store": False}


def _google(steps: list[Step]) -> dict[str, Any]:
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": "Run the commands."}]}]
    for call_id, command, output in steps:
        call = {"id": call_id, "name": "Bash", "args": {"command": command}}
        result = {"id": call_id, "name": "Bash", "response": {"output": output}}
        contents += [
            {"role": "model", "parts": [{"functionCall": call}]},
            {"role": "user", "parts": [{"functionResponse": result}]},
        ]
    tools = [{"functionDeclarations": [{"name": "Bash", "parameters": BASH}]}]
    return {"contents": contents, "tools": tools, "generationConfig": {"maxOutputTokens": 256}}


APIS = {
    "anthropic": Api(
        "/v1/messages",
        _anthropic,
        lambda reply: [b["id"] for b in reply["content"] if b["type"] == "tool_use"],
    ),
    "openai_chat": Api(
        "/v1/chat/completions",
        _chat,
        lambda reply: [c["id"] for c in reply["choices"][0]["message"]["tool_calls"]],
    ),
    "openai_responses": Api(
        "/v1/responses",
        _responses,
        lambda reply: [i["call_id"] for i in reply["output"] if i["type"] == "function_call"],
    ),
    "google": Api(
        "/v1beta/models/m:generateContent",
        _google,
        lambda reply: [
            p["functionCall"]["id"]
            for p in reply["candidates"][0]["content"]["parts"]
            if "functionCall" in p
        ],
    ),
}


@pytest.fixture(scope="module")
def kimi_tokenizer() -> Any:
    return family_tokenizer("kimi_k2")


def _gateway(db: Path, tokenizer: Any, first: int) -> ServedGateway:
    """A gateway whose model runs ``echo <first>`` and ``echo <first + 1>``, each as call 0."""
    family = get_family("kimi_k2")
    backend = FamilyBackend(family, tokenizer, script=Script(), max_model_len=32768)
    calls = [("Bash", {"command": f"echo {n}"}) for n in (first, first + 1)]
    backend.script.push(*[ScriptedReply(tool_calls=[call]) for call in calls])
    return ServedGateway(backend, db)


def _turn(gateway: ServedGateway, key: str, api: Api, steps: list[Step]) -> str:
    """One call continuing ``steps``; the step it adds (the reply's one call) joins them."""
    reply = httpx.post(f"{gateway.base_url}/s/{key}{api.path}", json=api.body(steps), timeout=60)
    assert reply.status_code == 200, reply.text
    (call_id,) = api.call_ids(reply.json())
    steps.append((call_id, f"echo {len(steps)}", f"out {len(steps)}"))
    return call_id


@pytest.mark.parametrize("name", list(APIS))
def test_repeated_model_ids_reach_each_api_unique_and_come_back_as_the_models_own(
    tmp_path: Path, kimi_tokenizer: Any, name: str
) -> None:
    api, db = APIS[name], tmp_path / "c.db"
    steps: list[Step] = []
    with _gateway(db, kimi_tokenizer, 0) as gateway:
        key = gateway.new_session().key
        given = [_turn(gateway, key, api, steps) for _ in range(2)]
        assert given == [REPEATED, f"{REPEATED}_2"]
        gateway.store.close()
    # A restarted gateway, on the same store: it maps the ids it gave before back to the
    # model's own, and issues none of them again.
    with _gateway(db, kimi_tokenizer, 2) as gateway:
        given += [_turn(gateway, key, api, steps) for _ in range(2)]
        records = gateway.records(key)
        gateway.store.close()
    assert len(set(given)) == 4, given
    assert [r.response["tool_calls"][0]["id"] for r in records] == [REPEATED] * 4
    assert [r.harness_call_ids for r in records] == [[g] for g in given]
    for record in records[1:]:
        history = record.upstream_request["messages"]
        assert {c["id"] for m in history for c in m.get("tool_calls") or []} == {REPEATED}
        assert {m["tool_call_id"] for m in history if m["role"] == "tool"} == {REPEATED}
        prompt = kimi_tokenizer.decode(record.prompt_ids)
        assert f"## Return of {REPEATED}" in prompt and f"{REPEATED}_" not in prompt
    # Each call extends the one before it, but for the first after the restart (its sampled
    # turns were in the old process's memory: it renders whole, from the model's own ids).
    assert [FLAG_SPLICED in r.flags for r in records] == [False, True, False, True]
    head = records[2].prompt_ids + records[2].sampled_ids
    assert records[3].prompt_ids[: len(head)] == head
