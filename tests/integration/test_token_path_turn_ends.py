"""The token path ends turns where the family does, and says when the budget cut one.

* The gateway sends the family's turn-end ids as ``stop_token_ids`` (vLLM's /v1/completions
  field, SGLang's sampling param) and records them with the sampling params; the scripted
  engine stops only at eos or those ids, as a real engine does, so a family whose turn end is
  not its eos (Kimi: ``<|im_end|>`` vs ``[EOS]``) would otherwise write past its turn.
* A turn cut at ``max_tokens`` that already holds complete calls reports the cut (chat
  ``length``, Responses ``incomplete``, Anthropic ``max_tokens``, Gemini ``MAX_TOKENS``),
  through the real SDKs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import types

from polar.engines.scripted import ScriptedReply
from polar.engines.sglang import SGLangEngine
from polar.engines.vllm import VLLMEngine
from polar.providers.types import NormalizedRequest, SamplingParams
from polar.rendering.families.registry import get_family

from .family_kit import FamilyBackend, ServedGateway, family_tokenizer

SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}}
CHAT_TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": SCHEMA}}]
CALL = ("shell", {"command": "ls -la"})


def test_engines_send_stop_token_ids_in_their_own_field() -> None:
    request = NormalizedRequest(
        "openai_chat", "m", [{"role": "user", "content": "hi"}], params=SamplingParams()
    )
    request.params.stop_token_ids = [7, 9]
    assert VLLMEngine("http://vllm").build_token_body([1], request)["stop_token_ids"] == [7, 9]
    body = SGLangEngine("http://sglang").build_token_body([1], request)
    assert body["sampling_params"]["stop_token_ids"] == [7, 9] and "stop_token_ids" not in body


@pytest.fixture(scope="module")
def kimi_backend() -> FamilyBackend:
    return FamilyBackend(get_family("kimi_k2"), family_tokenizer("kimi_k2"))


def test_the_scripted_engine_stops_only_at_eos_or_the_asked_ids(kimi_backend: Any) -> None:
    tok = kimi_backend.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token == "[EOS]"
    prompt = tok.encode("<|im_user|>user<|im_middle|>hi<|im_end|>", add_special_tokens=False)
    body = {"prompt": prompt, "max_tokens": 60}
    reply = ScriptedReply(content="hello there")

    ran_on = kimi_backend.respond_tokens(body, reply)["choices"][0]
    assert ran_on["finish_reason"] == "length" and len(ran_on["token_ids"]) == 60
    assert ran_on["token_ids"].index(im_end) < 59  # it wrote past its turn end

    stopped = kimi_backend.respond_tokens({**body, "stop_token_ids": [im_end]}, reply)
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == im_end
    assert choice["token_ids"][-1] == im_end and im_end not in choice["token_ids"][:-1]


def test_the_gateway_stops_a_family_at_its_turn_end_and_records_it(
    kimi_backend: Any, tmp_path: Path
) -> None:
    im_end = kimi_backend.tokenizer.convert_tokens_to_ids("<|im_end|>")
    with ServedGateway(kimi_backend, tmp_path / "c.db") as gateway:
        session = gateway.new_session()
        gateway.script(ScriptedReply(content="Listing.", tool_calls=[CALL]))
        client = openai.OpenAI(
            base_url=f"{gateway.base_url}/v1", api_key=session.key, max_retries=0
        )
        reply = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "List the files."}],
            tools=CHAT_TOOLS,
            max_tokens=400,
        )
        (record,) = gateway.records(session.key)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [
        (c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls
    ] == [CALL]
    assert kimi_backend.requests[-1]["stop_token_ids"] == [im_end]
    assert record.sampling["stop_token_ids"] == [im_end]
    assert record.sampled_ids[-1] == im_end


# Finish reason of a turn the budget cut after its complete call ------------------------------


def _budget_ending_after_the_call(gateway: Any) -> int:
    """The output budget that cuts the scripted call turn right before its turn-end token."""
    backend = gateway.engine.backend
    sampled, _, _, _ = backend.sample(ScriptedReply(tool_calls=[CALL]), 10**6)
    assert sampled[-1] == backend.eot_id
    return len(sampled) - 1


def _chat(session: Any, budget: int) -> tuple[str, list[Any]]:
    client = openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key)
    reply = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "List the files."}],
        tools=CHAT_TOOLS,
        max_tokens=budget,
    )
    choice = reply.choices[0]
    return choice.finish_reason, [c.function.name for c in choice.message.tool_calls or []]


def _chat_stream(session: Any, budget: int) -> tuple[str, list[Any]]:
    client = openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key)
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "List the files."}],
        tools=CHAT_TOOLS,
        max_tokens=budget,
        stream=True,
    )
    finish, names = "", []
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            names += [c.function.name for c in choice.delta.tool_calls or [] if c.function.name]
    return finish, names


def _responses(session: Any, budget: int) -> tuple[str, list[Any]]:
    client = openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key)
    reply = client.responses.create(
        model="m",
        input="List the files.",
        tools=[{"type": "function", "name": "shell", "parameters": SCHEMA, "strict": False}],
        max_output_tokens=budget,
    )
    reason = reply.incomplete_details.reason if reply.incomplete_details else None
    return f"{reply.status}:{reason}", [i.name for i in reply.output if i.type == "function_call"]


def _messages(session: Any, budget: int) -> tuple[str, list[Any]]:
    client = anthropic.Anthropic(base_url=session.base_urls["anthropic"], api_key=session.key)
    reply = client.messages.create(
        model="m",
        max_tokens=budget,
        messages=[{"role": "user", "content": "List the files."}],
        tools=[{"name": "shell", "input_schema": SCHEMA}],
    )
    return str(reply.stop_reason), [b.name for b in reply.content if b.type == "tool_use"]


def _gemini(session: Any, budget: int) -> tuple[str, list[Any]]:
    client = genai.Client(
        api_key=session.key, http_options=types.HttpOptions(base_url=session.base_urls["google"])
    )
    tool = types.Tool(
        function_declarations=[
            types.FunctionDeclaration(name="shell", parameters_json_schema=SCHEMA)
        ]
    )
    reply = client.models.generate_content(
        model="gemini-x",
        contents="List the files.",
        config=types.GenerateContentConfig(tools=[tool], max_output_tokens=budget),
    )
    candidate = reply.candidates[0]
    parts = candidate.content.parts
    return str(candidate.finish_reason.value), [
        p.function_call.name for p in parts if p.function_call
    ]


CUT = {
    "openai_chat": (_chat, "length"),
    "openai_chat_stream": (_chat_stream, "length"),
    "openai_responses": (_responses, "incomplete:max_output_tokens"),
    "anthropic": (_messages, "max_tokens"),
    "google": (_gemini, "MAX_TOKENS"),
}


@pytest.mark.slow
@pytest.mark.parametrize("noncanonical_gateway", ["gateway"], indirect=True)
@pytest.mark.parametrize("api", sorted(CUT))
def test_a_turn_cut_after_its_call_reports_the_cut_in_each_api(
    noncanonical_gateway: Any, api: str
) -> None:
    gateway = noncanonical_gateway
    gateway.reset()
    budget = _budget_ending_after_the_call(gateway)
    gateway.script(ScriptedReply(tool_calls=[CALL]))
    call, expected = CUT[api]
    finish, names = call(gateway.new_session(), budget)
    assert (finish, names) == (expected, ["shell"])
    assert gateway.engine_log[-1]["choices"][0]["finish_reason"] == "length"
