"""The embedded engine's HTTP app: vLLM-shaped replies, the real OpenAI SDK, clear errors."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
import torch

from polar.cli import serve_engine
from polar.engines.capture import capture_from_response
from polar.engines.embedded import EmbeddedEngineCore, create_app, load_model

HELLO = [{"role": "user", "content": "Hello there"}]
TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def core() -> Iterator[EmbeddedEngineCore]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = EmbeddedEngineCore(load_model("tiny"))
    yield engine
    engine.close()
    torch.set_num_threads(threads)


@pytest.fixture
async def client(core: EmbeddedEngineCore) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(core, served_model_names=["alias"])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://e") as c:
        yield c


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "polar-tiny-llama", "messages": HELLO, "max_tokens": 6, **extra}


async def test_reply_has_vllm_token_fields_and_sglang_token_ids(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/chat/completions",
        json=body(
            temperature=0.8,
            seed=4,
            logprobs=True,
            top_logprobs=0,
            return_token_ids=True,
            some_future_field={"x": 1},
        ),
    )
    assert response.status_code == 200
    reply = response.json()
    choice = reply["choices"][0]
    tokenized = (await client.post("/tokenize", json={"messages": HELLO})).json()
    assert reply["prompt_token_ids"] == tokenized["tokens"]
    entries = choice["logprobs"]["content"]
    assert [e["token_id"] for e in entries] == choice["token_ids"]
    assert all(e["top_logprobs"] == [] and e["logprob"] <= 0 for e in entries)
    assert entries[0]["bytes"] == list(entries[0]["token"].encode())
    assert (
        choice["message"]["role"] == "assistant" and choice["message"]["reasoning_content"] is None
    )
    assert reply["usage"] == {
        "prompt_tokens": len(reply["prompt_token_ids"]),
        "completion_tokens": len(choice["token_ids"]),
        "total_tokens": len(reply["prompt_token_ids"]) + len(choice["token_ids"]),
    }
    assert reply["policy_version"] == 0
    assert reply["sampling"]["temperature"] == 0.8 and reply["sampling"]["logprobs_mode"] == "raw"

    _, tokens = capture_from_response(reply)  # the gateway's own parser
    assert tokens.flags == [] and tokens.sampled_ids == choice["token_ids"]
    assert tokens.logprobs == [e["logprob"] for e in entries]


async def test_top_logprobs_and_no_logprobs(client: httpx.AsyncClient) -> None:
    reply = (
        await client.post("/v1/chat/completions", json=body(logprobs=True, top_logprobs=3))
    ).json()
    entry = reply["choices"][0]["logprobs"]["content"][0]
    assert len(entry["top_logprobs"]) == 3 and "token_id" in entry["top_logprobs"][0]
    reply = (await client.post("/v1/chat/completions", json=body())).json()
    assert reply["choices"][0]["logprobs"] is None and reply["choices"][0]["token_ids"]


async def test_unsupported_sampling_fields_are_recorded_not_silently_dropped(
    client: httpx.AsyncClient,
) -> None:
    reply = (
        await client.post(
            "/v1/chat/completions",
            json=body(
                presence_penalty=0.5,
                frequency_penalty=0,
                min_p=0.1,
                tools=TOOLS,
                tool_choice="required",
            ),
        )
    ).json()
    assert reply["sampling"]["ignored_params"] == ["presence_penalty", "min_p", "tool_choice"]


async def test_the_openai_sdk_reads_the_reply(core: EmbeddedEngineCore) -> None:
    app = create_app(core)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app))
    sdk = openai.AsyncOpenAI(base_url="http://e/v1", api_key="x", http_client=http)
    completion = await sdk.chat.completions.create(
        model=core.model_name,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        extra_body={"return_token_ids": True},
    )
    choice = completion.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert len(choice.logprobs.content) == len(choice.model_extra["token_ids"])
    assert completion.usage is not None and completion.usage.completion_tokens == len(
        choice.logprobs.content
    )
    models = await sdk.models.list()
    assert [m.id for m in models.data] == [core.model_name]
    await http.aclose()


async def test_models_tokenize_detokenize_health(client: httpx.AsyncClient) -> None:
    models = (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["polar-tiny-llama", "alias"]
    assert models["data"][0]["max_model_len"] == 8192
    tokens = (
        await client.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True})
    ).json()
    assert tokens["count"] == len(tokens["tokens"]) == len(tokens["token_strs"])
    text = (await client.post("/detokenize", json={"tokens": tokens["tokens"]})).json()
    assert text["prompt"] == "Hello world"
    with_tools = (await client.post("/tokenize", json={"messages": HELLO, "tools": TOOLS})).json()
    plain = (await client.post("/tokenize", json={"messages": HELLO})).json()
    assert with_tools["count"] > plain["count"]
    health = await client.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


@pytest.mark.parametrize(
    ("payload", "status", "needle"),
    [
        (body(model="gpt-4o"), 404, "gpt-4o"),
        (body(temperature=-1), 400, "temperature"),
        (body(temperature="hot"), 400, "temperature"),
        (body(top_p=0), 400, "top_p"),
        (body(top_k=-5), 400, "top_k"),
        (body(max_tokens=0), 400, "max_tokens"),
        (body(max_tokens=10**6), 400, "maximum context length"),
        (body(n=0), 400, "n must"),
        (body(seed=1.5), 400, "seed"),
        (body(stop=[1]), 400, "stop"),
        (body(stream=True), 400, "stream"),
        (body(messages=[]), 400, "messages"),
        (body(messages=[{"role": "user", "content": "w " * 9000}]), 400, "maximum context length"),
        (body(tools=[{"type": "function"}]), 400, "tools[0]"),
        (body(stop_token_ids=[10**9]), 400, "stop_token_ids"),
    ],
)
async def test_bad_input_gets_a_clear_error(
    client: httpx.AsyncClient, payload: dict[str, Any], status: int, needle: str
) -> None:
    response = await client.post("/v1/chat/completions", json=payload)
    assert response.status_code == status
    error = response.json()["error"]
    assert needle in error["message"] and error["code"] == status and error["type"]


async def test_malformed_json_and_bad_detokenize(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", content=b"{not json")
    assert response.status_code == 400 and "JSON" in response.json()["error"]["message"]
    response = await client.post("/v1/chat/completions", json=[1, 2])
    assert response.status_code == 400
    response = await client.post("/detokenize", json={"tokens": [-1]})
    assert response.status_code == 400


async def test_full_queue_answers_429_with_retry_after() -> None:
    engine = EmbeddedEngineCore(load_model("tiny"), max_queue=0)
    app = create_app(engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://e") as c:
        response = await c.post("/v1/chat/completions", json=body())
        assert response.status_code == 429
        assert int(response.headers["retry-after"]) >= 1
        engine.close()
        response = await c.post("/v1/chat/completions", json=body())
        assert response.status_code == 503


def test_cli_parser_defaults() -> None:
    parser = argparse.ArgumentParser()
    serve_engine.add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve-engine"])
    assert (args.model, args.host, args.port, args.dtype, args.logprobs_mode) == (
        "smollm2",
        "127.0.0.1",
        8200,
        "float32",
        "raw",
    )
    assert args.func is serve_engine.run
    args = parser.parse_args(
        [
            "serve-engine",
            "--model",
            "tiny",
            "--logprobs-mode",
            "processed",
            "--kv-cache-entries",
            "0",
        ]
    )
    assert (args.model, args.logprobs_mode, args.kv_cache_entries) == ("tiny", "processed", 0)


async def test_an_assistant_prefill_is_continued_not_closed(
    client: httpx.AsyncClient, core: EmbeddedEngineCore
) -> None:
    messages = [*HELLO, {"role": "assistant", "content": "Sure, here"}]
    response = await client.post(
        "/v1/chat/completions",
        json=body(messages=messages, continue_final_message=True, add_generation_prompt=False),
    )
    assert response.status_code == 200
    prompt = response.json()["prompt_token_ids"]
    assert core.decode(prompt).endswith("Sure, here")
    closed = (await client.post("/v1/chat/completions", json=body(messages=messages))).json()
    assert not core.decode(closed["prompt_token_ids"]).endswith("Sure, here")
