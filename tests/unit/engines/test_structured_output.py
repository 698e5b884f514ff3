"""Structured output on the engines' wire: each engine's own parameter, or a clear refusal."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import torch

from polar.engines.embedded import EmbeddedEngineCore, create_app, load_model
from polar.engines.scripted import (
    EngineRefusal,
    ScriptedBackend,
    ScriptedReply,
    create_scripted_app,
)
from polar.engines.sglang import SGLangEngine
from polar.engines.vllm import VLLMEngine
from polar.providers.types import NormalizedRequest, ResponseFormat

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def request(fmt: ResponseFormat | None) -> NormalizedRequest:
    messages = [{"role": "user", "content": "hi"}]
    return NormalizedRequest("openai_chat", "m", messages, response_format=fmt)


def test_vllm_token_prompt_asks_for_structured_outputs() -> None:
    engine = VLLMEngine("http://vllm")
    body = engine.build_token_body([1, 2], request(ResponseFormat("json_schema", SCHEMA)))
    assert body["structured_outputs"] == {"json": SCHEMA}
    body = engine.build_token_body([1, 2], request(ResponseFormat("json_object")))
    assert body["structured_outputs"] == {"json_object": True}
    assert "structured_outputs" not in engine.build_token_body([1], request(None))
    chat = engine.build_body(request(ResponseFormat("json_schema", SCHEMA, "n")))
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "n", "schema": SCHEMA},
    }


def test_sglang_generate_takes_json_schema_as_a_string() -> None:
    engine = SGLangEngine("http://sglang")
    body = engine.build_token_body([1, 2], request(ResponseFormat("json_schema", SCHEMA)))
    assert json.loads(body["sampling_params"]["json_schema"]) == SCHEMA
    body = engine.build_token_body([1, 2], request(ResponseFormat("json_object")))
    assert json.loads(body["sampling_params"]["json_schema"]) == {"type": "object"}


def test_scripted_engine_is_strict_about_its_scripted_reply(tokenizer: object) -> None:
    backend = ScriptedBackend(tokenizer=tokenizer)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    ok = backend.respond({**body, "response_format": fmt}, ScriptedReply(content='{"n": 3}'))
    assert ok["choices"][0]["message"]["content"] == '{"n": 3}'
    for bad in ("not json", '{"n": "three"}', "{}"):
        with pytest.raises(EngineRefusal, match="structured output"):
            backend.respond({**body, "response_format": fmt}, ScriptedReply(content=bad))
    tokens = {"prompt": [1, 2], "structured_outputs": {"json_object": True}}
    with pytest.raises(EngineRefusal, match="structured output"):
        backend.respond_tokens(tokens, ScriptedReply(content="[1]"))


@pytest.fixture(scope="module")
def core() -> Iterator[EmbeddedEngineCore]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = EmbeddedEngineCore(load_model("tiny"))
    yield engine
    engine.close()
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/v1/chat/completions", {"response_format": {"type": "json_object"}}),
        ("/v1/completions", {"structured_outputs": {"json": SCHEMA}}),
    ],
)
async def test_embedded_engine_refuses_structured_output(
    core: EmbeddedEngineCore, path: str, extra: dict[str, object]
) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "prompt": [1, 2], **extra}
    transport = httpx.ASGITransport(app=create_app(core))
    async with httpx.AsyncClient(transport=transport, base_url="http://e") as client:
        reply = await client.post(path, json=body)
    assert reply.status_code == 400
    assert "structured output" in reply.json()["error"]["message"]
    assert "embedded engine" in reply.json()["error"]["message"]


CALL_REGEX = r'<tool_call>\{"name": "shell"\}</tool_call>'


def test_a_forced_call_travels_as_each_engines_regex_on_token_prompts_only() -> None:
    forced = request(None)
    forced.forced_call_pattern = CALL_REGEX
    vllm = VLLMEngine("http://vllm")
    assert vllm.build_token_body([1], forced)["structured_outputs"] == {"regex": CALL_REGEX}
    assert "structured_outputs" not in vllm.build_body(forced)  # chat bodies carry tool_choice
    sglang = SGLangEngine("http://sglang")
    assert sglang.build_token_body([1], forced)["sampling_params"]["regex"] == CALL_REGEX
    assert (vllm.regex_constraint, sglang.regex_constraint) == (
        "structured_outputs.regex",
        "sampling_params.regex",
    )


def test_scripted_engine_samples_only_what_the_regex_matches(tokenizer: object) -> None:
    backend = ScriptedBackend(tokenizer=tokenizer)
    pattern = r'<tool_call>\s*\{"name": "shell", "arguments": \{\}\}\s*</tool_call>'
    body = {"prompt": [1, 2], "structured_outputs": {"regex": pattern}}
    call = ScriptedReply(tool_calls=[("shell", {})])
    reply = backend.respond_tokens(body, call)
    assert "shell" in tokenizer.decode(reply["choices"][0]["token_ids"])  # type: ignore[attr-defined]
    for wrong in (ScriptedReply(content="no call"), ScriptedReply(tool_calls=[("rm", {})])):
        with pytest.raises(EngineRefusal, match="does not match the regex"):
            backend.respond_tokens(body, wrong)
    broken = {"prompt": [1, 2], "structured_outputs": {"regex": "(unclosed"}}
    with pytest.raises(EngineRefusal, match="Invalid regular expression"):
        backend.respond_tokens(broken, call)


def test_a_text_only_scripted_model_refuses_images_as_vllm_does(tokenizer: object) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {"messages": [{"role": "user", "content": [image, {"type": "text", "text": "what?"}]}]}
    with pytest.raises(EngineRefusal, match="is not a multimodal model"):
        ScriptedBackend(tokenizer=tokenizer).respond(body, ScriptedReply(content="a cat"))
    seen = ScriptedBackend(tokenizer=tokenizer, multimodal=True)
    assert seen.respond(body, ScriptedReply(content="a cat"))["choices"][0]["message"]["content"]


async def test_embedded_engine_refuses_images(core: EmbeddedEngineCore) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {"messages": [{"role": "user", "content": [image]}], "max_tokens": 2}
    transport = httpx.ASGITransport(app=create_app(core))
    async with httpx.AsyncClient(transport=transport, base_url="http://e") as client:
        reply = await client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 400
    assert "is not a multimodal model" in reply.json()["error"]["message"]


async def test_token_counting_refuses_images_on_a_text_only_engine(
    core: EmbeddedEngineCore, tokenizer: object
) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {"messages": [{"role": "user", "content": [image]}]}
    embedded = httpx.ASGITransport(app=create_app(core))
    scripted = httpx.ASGITransport(app=create_scripted_app(ScriptedBackend(tokenizer=tokenizer)))
    for transport in (embedded, scripted):
        async with httpx.AsyncClient(transport=transport, base_url="http://e") as client:
            reply = await client.post("/tokenize", json=body)
        assert reply.status_code == 400
        assert "is not a multimodal model" in reply.json()["error"]["message"]
