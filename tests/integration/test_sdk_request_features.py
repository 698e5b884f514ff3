"""Request features a chat endpoint handles, through the real SDKs, in BOTH render modes.

With engine rendering the engine's chat endpoint gets the feature as the client asked; with
gateway rendering the gateway does what that endpoint would (``tool_choice`` as a regex over
the family's own call format, reasoning parsed into each API's own field, count_tokens as the
prompt actually sent) or refuses by name (images: a token prompt carries no pixels). The engine
samples non-canonically (pretty-printed JSON, split tokenizations), as real models do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from polar.engines.registry import EngineConfig, create_engine
from polar.engines.scripted import ScriptedReply
from polar.engines.types import ModelInfo
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.services import app_services

pytestmark = pytest.mark.slow

MODES = ("engine", "gateway")
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}}
CHAT_TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": SCHEMA}}]
CALL = ("shell", {"command": "ls -la"})
IMAGE_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


@pytest.fixture
def gateway(noncanonical_gateway: Any) -> Iterator[Any]:
    noncanonical_gateway.reset()
    yield noncanonical_gateway
    noncanonical_gateway.engine.backend.multimodal = False
    noncanonical_gateway.reset()


def in_both_modes(feature: str, cases: dict[str, tuple[str, str]]) -> pytest.MarkDecorator:
    """Parametrize over (render mode, api); each case is a conformance cell named by its mode.
    ``cases``: api -> (status with engine rendering, status with gateway rendering)."""
    params = [
        pytest.param(
            mode,
            api,
            marks=pytest.mark.conformance(
                feature=f"{feature} ({mode} rendering)", api=api, status=statuses[i]
            ),
            id=f"{api}-{mode}",
        )
        for api, statuses in cases.items()
        for i, mode in enumerate(MODES)
    ]
    return pytest.mark.parametrize(
        ("noncanonical_gateway", "api"), params, indirect=["noncanonical_gateway"]
    )


def _openai(session: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key, max_retries=0)


def _anthropic(session: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=session.base_urls["anthropic"], api_key=session.key, max_retries=0
    )


def _google(session: Any) -> genai.Client:
    return genai.Client(
        api_key=session.key, http_options=types.HttpOptions(base_url=session.base_urls["google"])
    )


def _google_tools() -> list[types.Tool]:
    declaration = types.FunctionDeclaration(name="shell", parameters_json_schema=SCHEMA)
    return [types.Tool(function_declarations=[declaration])]


def _google_config(**extra: Any) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(tools=_google_tools(), **extra)


Calls = list[tuple[str, dict[str, Any]]]


def _chat(choice: Any, legacy: bool = False) -> Callable[[Any], Calls]:
    def call(session: Any) -> Calls:
        messages = [{"role": "user", "content": "List the files."}]
        if legacy:
            reply = _openai(session).chat.completions.create(
                model="m",
                messages=messages,
                functions=[{"name": "shell", "parameters": SCHEMA}],
                function_call=choice,
            )
            fc = reply.choices[0].message.function_call
            return [(fc.name, json.loads(fc.arguments))] if fc else []
        reply = _openai(session).chat.completions.create(
            model="m", messages=messages, tools=CHAT_TOOLS, tool_choice=choice
        )
        calls = reply.choices[0].message.tool_calls or []
        return [(c.function.name, json.loads(c.function.arguments)) for c in calls]

    return call


def _responses(choice: Any) -> Callable[[Any], Calls]:
    def call(session: Any) -> Calls:
        reply = _openai(session).responses.create(
            model="m",
            input="List the files.",
            tools=[{"type": "function", "name": "shell", "parameters": SCHEMA, "strict": False}],
            tool_choice=choice,
        )
        items = [i for i in reply.output if i.type == "function_call"]
        return [(i.name, json.loads(i.arguments)) for i in items]

    return call


def _messages(choice: Any) -> Callable[[Any], Calls]:
    def call(session: Any) -> Calls:
        reply = _anthropic(session).messages.create(
            model="m",
            max_tokens=200,
            messages=[{"role": "user", "content": "List the files."}],
            tools=[{"name": "shell", "input_schema": SCHEMA}],
            tool_choice=choice,
        )
        return [(b.name, dict(b.input)) for b in reply.content if b.type == "tool_use"]

    return call


def _gemini(allowed: list[str] | None) -> Callable[[Any], Calls]:
    def call(session: Any) -> Calls:
        calling = types.FunctionCallingConfig(mode="ANY", allowed_function_names=allowed)
        client = _google(session)
        reply = client.models.generate_content(
            model="gemini-x",
            contents="List the files.",
            config=_google_config(tool_config=types.ToolConfig(function_calling_config=calling)),
        )
        parts = reply.candidates[0].content.parts
        return [
            (p.function_call.name, dict(p.function_call.args)) for p in parts if p.function_call
        ]

    return call


def _interactions(choice: Any) -> Callable[[Any], Calls]:
    def call(session: Any) -> Calls:
        tool = {"type": "function", "name": "shell", "parameters": SCHEMA}
        client = _google(session)  # kept: a collected client closes its connection
        reply = client.interactions.create(
            model="gemini-x",
            input="List the files.",
            tools=[tool],
            generation_config={"tool_choice": choice},
        )
        steps = reply.steps or []
        return [(s.name, dict(s.arguments)) for s in steps if s.type == "function_call"]

    return call


FORCED = {
    "tool_choice required": ("openai_chat", _chat("required"), "required"),
    "tool_choice named": (
        "openai_chat",
        _chat({"type": "function", "function": {"name": "shell"}}),
        {"type": "function", "function": {"name": "shell"}},
    ),
    "legacy function_call named": (
        "openai_chat",
        _chat({"name": "shell"}, legacy=True),
        {"type": "function", "function": {"name": "shell"}},
    ),
    "tool_choice required (Responses)": ("openai_responses", _responses("required"), "required"),
    "tool_choice named (Responses)": (
        "openai_responses",
        _responses({"type": "function", "name": "shell"}),
        {"type": "function", "function": {"name": "shell"}},
    ),
    "tool_choice any": ("anthropic", _messages({"type": "any"}), "required"),
    "tool_choice tool": (
        "anthropic",
        _messages({"type": "tool", "name": "shell"}),
        {"type": "function", "function": {"name": "shell"}},
    ),
    "tool_config ANY": ("google", _gemini(None), "required"),
    "tool_config ANY, one allowed function": (
        "google",
        _gemini(["shell"]),
        {"type": "function", "function": {"name": "shell"}},
    ),
    "tool_choice any (Interactions)": ("google_interactions", _interactions("any"), "required"),
    "tool_choice named (Interactions)": (
        "google_interactions",
        _interactions({"allowed_tools": {"mode": "any", "tools": ["shell"]}}),
        {"type": "function", "function": {"name": "shell"}},
    ),
}


def _forced_params() -> list[Any]:
    params = []
    for feature, (api, _, _) in FORCED.items():
        for mode, status in zip(MODES, ("supported", "mapped"), strict=True):
            mark = pytest.mark.conformance(
                feature=f"{feature.split(' (')[0]} ({mode} rendering)", api=api, status=status
            )
            params.append(pytest.param(mode, feature, marks=mark, id=f"{feature}-{mode}"))
    return params


@pytest.mark.parametrize(
    ("noncanonical_gateway", "feature"), _forced_params(), indirect=["noncanonical_gateway"]
)
def test_a_forced_tool_call_is_enforced_by_the_engine(gateway: Any, feature: str) -> None:
    _, make_call, normalized = FORCED[feature]
    session = gateway.new_session()
    gateway.script(ScriptedReply(tool_calls=[CALL]))
    assert make_call(session) == [CALL]
    [record] = gateway.records(session.key)
    [sent] = gateway.engine.backend.requests
    if gateway.render_mode == "engine":
        assert sent["tool_choice"] == normalized  # the engine's chat endpoint enforces it
        assert "structured_outputs" not in sent
    else:
        pattern = sent["structured_outputs"]["regex"]
        assert "<tool_call>" in pattern and '"shell"' in pattern  # the family's own format
        assert "tool_choice_enforced:structured_outputs.regex" in record.flags
        kind = "required" if normalized == "required" else "named"
        assert f"feature tool_choice {kind}: mapped" in record.notes


@in_both_modes("tool_choice none", {"openai_chat": ("supported", "supported")})
def test_tool_choice_none_leaves_a_sampled_call_as_text(gateway: Any, api: str) -> None:
    session = gateway.new_session()
    gateway.script(ScriptedReply(tool_calls=[CALL]))
    reply = _openai(session).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Files?"}],
        tools=CHAT_TOOLS,
        tool_choice="none",
    )
    message = reply.choices[0].message
    assert not message.tool_calls
    assert reply.choices[0].finish_reason == "stop"
    assert "<tool_call>" in message.content and '"shell"' in message.content


@pytest.mark.parametrize("noncanonical_gateway", MODES, indirect=True)
def test_the_engine_refuses_a_reply_that_breaks_the_forced_call(gateway: Any) -> None:
    """The scripted engine is as strict as a constrained one: a text reply under
    tool_choice required cannot be sampled, so it is an engine error, never a 200 text."""
    session = gateway.new_session()
    gateway.script(ScriptedReply(content="I will not call a tool."))
    with pytest.raises(openai.BadRequestError, match="structured output"):
        _chat("required")(session)
    assert gateway.records(session.key) == []


@pytest.mark.conformance(
    feature="tool_choice required (gateway rendering, embedded engine)",
    api="anthropic",
    status="refused",
)
async def test_the_embedded_engine_refuses_a_forced_call_by_name(tmp_path: Any) -> None:
    engine = create_engine(EngineConfig(kind="embedded", options={"model": "tiny"}))
    app = create_app(GatewayConfig(capture_db=tmp_path / "c.db", auth=False), engine=engine)
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "List the files."}],
        "tools": [{"name": "shell", "input_schema": SCHEMA}],
        "tool_choice": {"type": "any"},
    }
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        key = (await c.post("/polar/sessions", json={})).json()["session_id"]
        reply = await c.post(f"/s/{key}/v1/messages", json=body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "tool_choice required is not supported by this engine" in error["message"]
    assert app_services(app).store.records(key) == []
    await engine.aclose()


REASONING = "The user wants a listing; ls does it."


def _chat_reasoning(session: Any, stream: bool) -> str:
    client = _openai(session)
    messages = [{"role": "user", "content": "Files?"}]
    if not stream:
        reply = client.chat.completions.create(model="m", messages=messages)
        return str(reply.choices[0].message.model_extra["reasoning_content"])
    chunks = list(client.chat.completions.create(model="m", messages=messages, stream=True))
    return "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
        for c in chunks
        if c.choices
    )


def _responses_reasoning(session: Any, stream: bool) -> str:
    client = _openai(session)
    if not stream:
        reply = client.responses.create(model="m", input="Files?")
        return "".join(s.text for i in reply.output if i.type == "reasoning" for s in i.summary)
    events = list(client.responses.create(model="m", input="Files?", stream=True))
    return "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")


def _anthropic_reasoning(session: Any, stream: bool) -> str:
    client = _anthropic(session)
    kwargs: dict[str, Any] = {
        "model": "m",
        "max_tokens": 300,
        "messages": [{"role": "user", "content": "Files?"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    if not stream:
        reply = client.messages.create(**kwargs)
        return "".join(b.thinking for b in reply.content if b.type == "thinking")
    with client.messages.stream(**kwargs) as events:
        message = events.get_final_message()
    return "".join(b.thinking for b in message.content if b.type == "thinking")


def _google_reasoning(session: Any, stream: bool) -> str:
    client = _google(session)
    config = types.GenerateContentConfig(
        thinking_config=types.ThinkingConfig(include_thoughts=True)
    )
    if not stream:
        replies = [client.models.generate_content(model="g", contents="Files?", config=config)]
    else:
        replies = list(
            client.models.generate_content_stream(model="g", contents="Files?", config=config)
        )
    return "".join(
        p.text or ""
        for r in replies
        for c in r.candidates or []
        for p in (c.content.parts if c.content and c.content.parts else [])
        if p.thought
    )


REASONING_READERS: dict[str, Callable[[Any, bool], str]] = {
    "openai_chat": _chat_reasoning,
    "openai_responses": _responses_reasoning,
    "anthropic": _anthropic_reasoning,
    "google": _google_reasoning,
}


@in_both_modes("reasoning", {api: ("supported", "supported") for api in REASONING_READERS})
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_reasoning_comes_back_in_each_apis_own_field(gateway: Any, api: str, stream: bool) -> None:
    session = gateway.new_session()
    gateway.script(ScriptedReply(content="Two files.", reasoning=REASONING))
    assert REASONING_READERS[api](session, stream) == REASONING
    [record] = gateway.records(session.key)
    assert record.response["reasoning"] == REASONING
    assert record.response["content"] == "Two files."  # not left in the answer


DATA_URL = f"data:image/png;base64,{IMAGE_PNG}"


def _chat_image(session: Any) -> Any:
    image = {"type": "image_url", "image_url": {"url": DATA_URL}}
    content = [image, {"type": "text", "text": "What is this?"}]
    return _openai(session).chat.completions.create(
        model="m", messages=[{"role": "user", "content": content}]
    )


def _responses_image(session: Any) -> Any:
    content = [
        {"type": "input_image", "image_url": DATA_URL},
        {"type": "input_text", "text": "What is this?"},
    ]
    return _openai(session).responses.create(
        model="m", input=[{"role": "user", "content": content}]
    )


def _anthropic_image(session: Any) -> Any:
    source = {"type": "base64", "media_type": "image/png", "data": IMAGE_PNG}
    content = [{"type": "image", "source": source}, {"type": "text", "text": "What is this?"}]
    return _anthropic(session).messages.create(
        model="m", max_tokens=50, messages=[{"role": "user", "content": content}]
    )


def _google_inline_image(session: Any) -> Any:
    part = types.Part.from_bytes(data=b"\x89PNG\r\n", mime_type="image/png")
    client = _google(session)  # kept: a collected client closes its connection
    return client.models.generate_content(
        model="g", contents=[types.Content(role="user", parts=[part, types.Part(text="What?")])]
    )


def _google_file_image(session: Any) -> Any:
    part = types.Part.from_uri(file_uri="https://example.com/cat.png", mime_type="image/png")
    client = _google(session)  # kept: a collected client closes its connection
    return client.models.generate_content(
        model="g", contents=[types.Content(role="user", parts=[part, types.Part(text="What?")])]
    )


IMAGE_SENDERS: dict[str, Callable[[Any], Any]] = {
    "openai_chat": _chat_image,
    "openai_responses": _responses_image,
    "anthropic": _anthropic_image,
    "google": _google_inline_image,
    "google fileData": _google_file_image,
}
_API_ERRORS = (openai.BadRequestError, anthropic.BadRequestError, genai_errors.ClientError)


@in_both_modes(
    "images",
    {
        api: ("supported", "refused")
        for api in ("openai_chat", "openai_responses", "anthropic", "google")
    },
)
def test_images_reach_a_multimodal_engine_or_are_refused_by_name(gateway: Any, api: str) -> None:
    senders = [s for name, s in IMAGE_SENDERS.items() if name.split()[0] == api]
    for send in senders:
        session = gateway.new_session()
        gateway.script(ScriptedReply(content="A cat."), ScriptedReply(content="A cat."))
        gateway.engine.backend.multimodal = False
        with pytest.raises(_API_ERRORS) as refused:
            send(session)
        if gateway.render_mode == "gateway":
            assert "images are not supported under gateway rendering" in str(refused.value)
            assert gateway.engine.backend.requests == []  # refused before the engine
            continue
        assert "is not a multimodal model" in str(refused.value)  # the text-only engine's 400
        gateway.engine.backend.multimodal = True
        send(session)  # a multimodal engine gets the image itself, not "[image]"
        parts = gateway.engine.backend.requests[-1]["messages"][-1]["content"]
        assert any(p.get("type") == "image_url" for p in parts)
        gateway.engine.backend.requests.clear()


@in_both_modes("function calls without ids", {"google": ("supported", "supported")})
def test_gemini_calls_answered_without_ids_continue_the_sampled_turn(
    gateway: Any, api: str
) -> None:
    session = gateway.new_session()
    client = _google(session)
    gateway.script(ScriptedReply(tool_calls=[CALL]), ScriptedReply(content="Two files."))
    contents: list[Any] = [types.Content(role="user", parts=[types.Part(text="Files?")])]
    first = client.models.generate_content(model="g", contents=contents, config=_google_config())
    call = first.candidates[0].content.parts[0].function_call
    # google-genai users (and Pi's Gemini mode) send the call back by name, without its id.
    echoed = types.FunctionCall(name=call.name, args=call.args)
    contents += [
        types.Content(role="model", parts=[types.Part(function_call=echoed)]),
        types.Content(
            role="user",
            parts=[
                types.Part(
                    function_response=types.FunctionResponse(name="shell", response={"out": "a b"})
                )
            ],
        ),
    ]
    second = client.models.generate_content(model="g", contents=contents, config=_google_config())
    assert second.text == "Two files."
    one, two = gateway.records(session.key)
    if gateway.render_mode == "gateway":
        # Recognised by name and arguments: the second prompt carries the first call's
        # sampled ids exactly (one merged trace, not a re-render that drifts and splits).
        assert "prompt_extends_sampled_turn" in two.flags
        assert two.prompt_ids[: len(one.prompt_ids) + len(one.sampled_ids)] == (
            one.prompt_ids + one.sampled_ids
        )


def _anthropic_count(session: Any, messages: list[dict[str, Any]]) -> int:
    return _anthropic(session).messages.count_tokens(model="m", messages=messages).input_tokens


@in_both_modes(
    "token counting of a continued turn",
    {"anthropic": ("supported", "supported"), "google": ("supported", "supported")},
)
def test_count_tokens_equals_the_prompt_the_same_request_sends(gateway: Any, api: str) -> None:
    session = gateway.new_session()
    gateway.script(ScriptedReply(tool_calls=[CALL]), ScriptedReply(content="Two files."))
    if api == "anthropic":
        client = _anthropic(session)
        tools = [{"name": "shell", "input_schema": SCHEMA}]
        messages: list[Any] = [{"role": "user", "content": "Files?"}]
        first = client.messages.create(model="m", max_tokens=200, messages=messages, tools=tools)
        use = next(b for b in first.content if b.type == "tool_use")
        messages += [
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a b"}],
            },
        ]
        counted = client.messages.count_tokens(
            model="m", messages=messages, tools=tools
        ).input_tokens
        client.messages.create(model="m", max_tokens=200, messages=messages, tools=tools)
    else:
        client = _google(session)
        contents: list[Any] = [types.Content(role="user", parts=[types.Part(text="Files?")])]
        first = client.models.generate_content(
            model="g", contents=contents, config=_google_config()
        )
        contents += [
            first.candidates[0].content,
            types.Content(
                role="user",
                parts=[
                    types.Part(
                        function_response=types.FunctionResponse(
                            id=first.candidates[0].content.parts[0].function_call.id,
                            name="shell",
                            response={"out": "a b"},
                        )
                    )
                ],
            ),
        ]
        # google-genai sends no tools to countTokens outside Vertex; Gemini CLI posts the whole
        # generateContentRequest, as here.
        request = {
            "contents": [c.model_dump(mode="json", exclude_none=True) for c in contents],
            "tools": [
                {"functionDeclarations": [{"name": "shell", "parametersJsonSchema": SCHEMA}]}
            ],
        }
        counted = httpx.post(
            session.base_urls["google"].rstrip("/") + "/v1beta/models/g:countTokens",
            json={"generateContentRequest": request},
            headers={"x-goog-api-key": session.key},
        ).json()["totalTokens"]
        client.models.generate_content(model="g", contents=contents, config=_google_config())
    _, two = gateway.records(session.key)
    assert counted == len(two.prompt_ids)
    if gateway.render_mode == "gateway":
        assert "prompt_extends_sampled_turn" in two.flags


@pytest.mark.parametrize("noncanonical_gateway", ["gateway"], indirect=True)
async def test_no_context_window_still_sends_a_sane_output_budget(
    noncanonical_gateway: Any, tmp_path: Any
) -> None:
    """An engine that reports no window: the token prompt carries render.default_max_tokens
    (vLLM's /v1/completions stops at 16 tokens without one), flagged on the record."""
    engine = noncanonical_gateway.engine
    original = engine.model_info

    async def no_window() -> ModelInfo:
        info = await original()
        assert info is not None
        return ModelInfo(info.name, None, info.root)

    engine.model_info = no_window  # type: ignore[method-assign]
    config = GatewayConfig(
        capture_db=tmp_path / "c.db",
        auth=False,
        render={"tool_parser": "qwen3", "default_max_tokens": 321},
    )
    app = create_app(config, engine=engine)
    noncanonical_gateway.reset()
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://g"
        ) as c:
            key = (await c.post("/polar/sessions", json={})).json()["session_id"]
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            reply = await c.post(f"/s/{key}/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
    finally:
        del engine.model_info
    [sent] = engine.backend.requests
    assert sent["max_tokens"] == 321
    [record] = app_services(app).store.records(key)
    assert "max_tokens_defaulted:321" in record.flags


@pytest.mark.conformance(
    feature="tool_config ANY, several allowed functions of more", api="google", status="refused"
)
def test_gemini_allowing_some_of_the_functions_is_refused_by_name(live_gateway: Any) -> None:
    session = live_gateway.new_session()
    client = _google(session)
    names = ("shell", "read", "write")
    tools = [types.Tool(function_declarations=[types.FunctionDeclaration(name=n) for n in names])]
    calling = types.FunctionCallingConfig(mode="ANY", allowed_function_names=["shell", "read"])
    config = types.GenerateContentConfig(
        tools=tools, tool_config=types.ToolConfig(function_calling_config=calling)
    )
    with pytest.raises(genai_errors.ClientError, match="allowedFunctionNames naming some"):
        client.models.generate_content(model="g", contents="Files?", config=config)
    assert live_gateway.engine_log == []


@pytest.mark.conformance(
    feature="tool_choice allowed_tools, some of the tools", api="openai_responses", status="refused"
)
def test_responses_allowing_some_of_the_tools_is_refused_by_name(live_gateway: Any) -> None:
    session = live_gateway.new_session()
    tools = [{"type": "function", "name": n, "parameters": SCHEMA} for n in ("shell", "read")]
    choice = {
        "type": "allowed_tools",
        "mode": "auto",
        "tools": [{"type": "function", "name": "read"}],
    }
    with pytest.raises(openai.BadRequestError, match="allowed_tools naming some"):
        _openai(session).responses.create(
            model="m", input="Files?", tools=tools, tool_choice=choice
        )
    assert live_gateway.engine_log == []
