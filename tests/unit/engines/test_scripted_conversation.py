"""The scripted engine's conversation scripts: each concurrent session follows its own script."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from polar.engines.scripted import (
    ConversationScript,
    ScriptedBackend,
    ScriptedReply,
    create_scripted_app,
)

MODEL = "polar-scripted"


def backend(tokenizer: Any) -> ScriptedBackend:
    script = ConversationScript(
        {
            "ISSUE-A": [ScriptedReply(content="a0"), ScriptedReply(content="a1")],
            "ISSUE-B": [ScriptedReply(content="b0")],
        },
        default=ScriptedReply(content="fallback"),
        replies=[ScriptedReply(content="queued")],
    )
    return ScriptedBackend(script, tokenizer=tokenizer, model_name=MODEL)


def chat(task: str, turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": task}]}]
    for i in range(turns):
        messages += [{"role": "assistant", "content": f"step {i}"}]
        messages += [{"role": "user", "content": "go on"}]
    return {"model": MODEL, "messages": messages}


async def post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> str:
    reply = await client.post(path, json=body)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    return str(choice["message"]["content"] if "message" in choice else choice["text"])


async def test_chat_requests_follow_their_own_script_at_their_own_turn(tokenizer: Any) -> None:
    app = create_scripted_app(backend(tokenizer))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
        bodies = [chat("fix ISSUE-B", 0), chat("fix ISSUE-A", 1), chat("fix ISSUE-A", 0)]
        got = await asyncio.gather(*(post(client, "/v1/chat/completions", b) for b in bodies))
        assert got == ["b0", "a1", "a0"]
        # Past the end of its script, a session gets the default; no marker takes the queue.
        assert await post(client, "/v1/chat/completions", chat("ISSUE-B", 3)) == "fallback"
        assert await post(client, "/v1/chat/completions", chat("other", 0)) == "queued"
        assert await post(client, "/v1/chat/completions", chat("other", 0)) == "fallback"


async def test_token_prompts_are_read_back_to_find_the_script_and_the_turn(
    tokenizer: Any,
) -> None:
    scripted = backend(tokenizer)
    transport = httpx.ASGITransport(app=create_scripted_app(scripted))
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
        for turns, want in ((0, "a0"), (1, "a1"), (2, "fallback")):
            body = chat("please fix ISSUE-A", turns)
            prompt = scripted.prompt_ids(body["messages"], None)
            token_body = {"model": MODEL, "prompt": prompt, "max_tokens": 16}
            assert await post(client, "/v1/completions", token_body) == want
