"""The Interactions API adapter, checked against google-genai's own Interactions client.

The SDK talks to the adapter through an ``httpx.MockTransport`` (``HttpOptions(httpx_client=...)``),
so its own request builder, SSE reader, resource models and error classes judge our wire shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from google import genai
from google.genai import types
from google.genai._interactions_errors import BadRequestError, NotFoundError
from google.genai.interactions import ErrorEvent, Interaction

from polar.errors import (
    AuthenticationFailed,
    ContextLengthExceeded,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    GatewayError,
    InvalidRequest,
    NotFound,
    RateLimited,
)
from polar.providers.base import GENERATE, RequestContext
from polar.providers.google_interactions import GoogleInteractionsProvider
from polar.providers.google_interactions_output import InteractionsState
from polar.providers.reasoning_codec import decode_reasoning_b64, encode_reasoning_b64
from polar.providers.registry import ProviderSet
from polar.providers.stateful import RETRIEVE
from polar.providers.types import (
    Completion,
    NormalizedRequest,
    ReasoningEffort,
    ResponseFormat,
    SamplingParams,
    ToolCall,
)

PROVIDER = GoogleInteractionsProvider()
API = "google_interactions"
PATH = "/v1/interactions"
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
}
CHAT_SHELL = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}
CALL_COMPLETION = Completion(
    id="chatcmpl-abc123",
    model="engine-model",
    content="Listing. ✓",
    reasoning="The user wants files; ls.",
    tool_calls=[ToolCall(id="call_1", name="shell", arguments='{"command": "ls", "n": [1, 2.5]}')],
    finish_reason="tool_calls",
    prompt_tokens=40,
    completion_tokens=12,
    created=1767225600,
)
TEXT_COMPLETION = Completion(
    id="chatcmpl-def456", model="m", content="Two files.", prompt_tokens=9, completion_tokens=3
)


def parse(body: dict[str, Any], headers: dict[str, str] | None = None) -> NormalizedRequest:
    return PROVIDER.parse_request(body, RequestContext(path=PATH, headers=headers or {}))


class Gateway:
    """The adapter's half of the gateway, as an httpx transport handler; records what it parsed."""

    def __init__(self, engine: Callable[[NormalizedRequest], Completion]) -> None:
        self.engine = engine
        self.requests: list[NormalizedRequest] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        context = RequestContext(path=request.url.path, method=request.method, headers=headers)
        self.paths.append(request.url.path)
        self.headers.append(headers)
        try:
            normalized = PROVIDER.parse_request(orjson.loads(request.content), context)
        except GatewayError as err:
            return httpx.Response(err.status, json=PROVIDER.error_body(err))
        self.requests.append(normalized)
        completion = self.engine(normalized)
        if normalized.stream:
            body = b"".join(PROVIDER.render_stream(completion, normalized))
            return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=PROVIDER.render_response(completion, normalized))


def sdk_client(handler: Callable[[httpx.Request], httpx.Response]) -> genai.Client:
    options = types.HttpOptions(
        base_url="http://gateway/s/session-key",
        httpx_client=httpx.Client(transport=httpx.MockTransport(handler)),
        retry_options=types.HttpRetryOptions(attempts=1),
    )
    return genai.Client(api_key="session-key", http_options=options)


# --------------------------------------------------------------------------- routes


@pytest.mark.parametrize(
    ("method", "path", "operation"),
    [
        ("POST", "/v1/interactions", GENERATE),
        ("POST", "/v1beta/interactions", GENERATE),
        ("POST", "/v1beta1/projects/p/locations/us-central1/interactions", GENERATE),
        ("GET", "/v1/interactions/v1_abc", RETRIEVE),
        ("DELETE", "/v1beta/interactions/v1_abc", RETRIEVE),
        ("POST", "/v1/interactions/v1_abc/cancel", RETRIEVE),  # refused by name in reply_id
        ("GET", "/v1/interactions", None),
        ("POST", "/v1/interactions/v1_abc", None),
        ("POST", "/v1beta/models/g:generateContent", None),
        ("POST", "/v1/responses", None),
    ],
)
def test_routes(method: str, path: str, operation: str | None) -> None:
    assert PROVIDER.operation(RequestContext(path=path, method=method)) == operation


def test_the_registry_routes_interactions_here_and_generate_content_to_google() -> None:
    providers = ProviderSet()
    found = providers.by_path(RequestContext(path="/v1beta/interactions"))
    assert found is not None and found[0].name == API
    found = providers.by_path(RequestContext(path="/v1beta/models/g:generateContent"))
    assert found is not None and found[0].name == "google"


# --------------------------------------------------------------------------- requests


def test_sdk_request_maps_every_field_it_sends() -> None:
    gateway = Gateway(lambda _: TEXT_COMPLETION)
    config = {
        "temperature": 0.3,
        "top_p": 0.9,
        "seed": 7,
        "stop_sequences": ["END"],
        "max_output_tokens": 256,
        "thinking_level": "high",
        "tool_choice": "any",
    }
    sdk_client(gateway).interactions.create(
        model="gemini-3-flash-preview",
        input="What files?",
        system_instruction="Be brief.",
        tools=[SHELL],
        generation_config=config,
        labels={"run": "r1"},
    )
    assert gateway.paths == ["/s/session-key/v1/interactions"]
    assert gateway.headers[0]["x-goog-api-key"] == "session-key"
    request = gateway.requests[0]
    assert request.model == request.requested_model == "gemini-3-flash-preview"
    assert request.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What files?"},
    ]
    assert request.tools == [CHAT_SHELL]
    assert request.tool_choice == "required"
    assert request.params == SamplingParams(
        max_tokens=256, temperature=0.3, top_p=0.9, stop=["END"], seed=7
    )
    assert request.reasoning.effort == ReasoningEffort(
        "generation_config.thinking_level", "high", "high"
    )
    assert request.stream is False
    assert request.capture.features == {"labels": "honoured", "store": "honoured"}


def test_sdk_reads_the_reply_steps_status_and_usage() -> None:
    gateway = Gateway(lambda _: CALL_COMPLETION)
    reply = sdk_client(gateway).interactions.create(model="g", input="files?", tools=[SHELL])
    assert isinstance(reply, Interaction)
    assert reply.id == "v1_abc123" and reply.status == "requires_action"
    thought, output, call = reply.steps or []
    assert (
        thought.type == "thought" and output.type == "model_output" and call.type == "function_call"
    )
    assert decode_reasoning_b64(thought.signature) == CALL_COMPLETION.reasoning
    assert [s.text for s in thought.summary or []] == [CALL_COMPLETION.reasoning]
    assert reply.output_text == "Listing. ✓"
    assert (call.id, call.name, call.arguments) == (
        "call_1",
        "shell",
        {"command": "ls", "n": [1, 2.5]},
    )
    assert reply.usage is not None
    usage = reply.usage
    assert (usage.total_input_tokens, usage.total_output_tokens, usage.total_tokens) == (40, 12, 52)
    assert reply.model == "g" and reply.created == "2026-01-01T00:00:00Z"
    assert reply.tools is not None and reply.tools[0].name == "shell"  # echoed as sent


@pytest.mark.conformance(
    feature="reasoning omitted from the reply (display omitted, includeThoughts false)",
    api=API,
    status="supported",
)
def test_thinking_summaries_none_leaves_the_summary_out_but_signs_the_reasoning() -> None:
    gateway = Gateway(lambda _: CALL_COMPLETION)
    reply = sdk_client(gateway).interactions.create(
        model="g", input="files?", tools=[SHELL], generation_config={"thinking_summaries": "none"}
    )
    thought = (reply.steps or [])[0]
    assert thought.type == "thought" and thought.summary is None
    assert decode_reasoning_b64(thought.signature) == CALL_COMPLETION.reasoning
    assert (
        gateway.requests[0].capture.features["generation_config.thinking_summaries"] == "honoured"
    )


def test_a_replayed_history_folds_each_sampled_turn_into_one_assistant_message() -> None:
    """What a stateless client (store false) sends back: the steps it got, then the results."""
    gateway = Gateway(lambda _: CALL_COMPLETION)
    client = sdk_client(gateway)
    first = client.interactions.create(model="g", input="files?", tools=[SHELL], store=False)
    history: list[Any] = [
        {"type": "user_input", "content": [{"type": "text", "text": "files?"}]},
        *[step.model_dump(exclude_none=True) for step in first.steps or []],
        {"type": "function_result", "call_id": "call_1", "name": "shell", "result": "a b"},
        {"type": "user_input", "content": [{"type": "text", "text": "thanks"}]},
    ]
    client.interactions.create(model="g", input=history, tools=[SHELL], store=False)
    assert gateway.requests[1].messages == [
        {"role": "user", "content": "files?"},
        {
            "role": "assistant",
            "content": "Listing. ✓",
            "reasoning": CALL_COMPLETION.reasoning,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"command":"ls","n":[1,2.5]}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a b"},
        {"role": "user", "content": "thanks"},
    ]
    assert "store" not in gateway.requests[1].capture.features
    assert PROVIDER.reply_to_store(CALL_COMPLETION, gateway.requests[1]) is None


def test_a_thought_without_our_signature_is_read_from_its_summary() -> None:
    steps = [
        {"type": "user_input", "content": [{"type": "text", "text": "hi"}]},
        {
            "type": "thought",
            "signature": "Zm9yZWlnbg==",
            "summary": [{"type": "text", "text": "r"}],
        },
        {"type": "model_output", "content": [{"type": "text", "text": "a"}]},
        {"type": "model_output", "content": [{"type": "text", "text": "b"}]},
    ]
    assert parse({"model": "g", "input": steps}).messages[1] == {
        "role": "assistant",
        "content": "a\nb",
        "reasoning": "r",
    }


@pytest.mark.parametrize(
    ("raw", "content"),
    [
        ({"type": "text", "text": "hi"}, "hi"),
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "a\nb"),
        (
            [
                {"type": "image", "data": "AAAA", "mime_type": "image/png"},
                {"type": "text", "text": "?"},
            ],
            [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": "?"},
            ],
        ),
        (
            [{"type": "image", "uri": "https://x/cat.png"}],
            [{"type": "image_url", "image_url": {"url": "https://x/cat.png"}}],
        ),
    ],
)
def test_content_inputs_are_one_user_turn(raw: Any, content: Any) -> None:
    assert parse({"model": "g", "input": raw}).messages == [{"role": "user", "content": content}]


@pytest.mark.parametrize(
    ("result", "is_error", "content"),
    [
        ("plain", None, "plain"),
        ({"files": ["a", "b"]}, None, '{"files":["a","b"]}'),
        ([{"type": "text", "text": "x"}, {"type": "text", "text": "y"}], None, "x\ny"),
        ("no such file", True, "Error: no such file"),
    ],
)
def test_function_results_become_tool_messages(result: Any, is_error: Any, content: str) -> None:
    step: dict[str, Any] = {"type": "function_result", "call_id": "c1", "result": result}
    if is_error is not None:
        step["is_error"] = is_error
    call = {"type": "function_call", "id": "c1", "name": "shell", "arguments": {}}
    messages = parse({"model": "g", "input": [call, step]}).messages
    assert messages[1] == {"role": "tool", "tool_call_id": "c1", "content": content}


def test_accepted_fields_are_honoured_or_mapped_by_name() -> None:
    request = parse(
        {
            "model": "g",
            "input": "hi",
            "safety_settings": [{"type": "harassment", "threshold": "block_none"}],
            "response_modalities": ["text"],
            "service_tier": "flex",
            "background": False,
            "store": True,
            "stream": True,
        }
    )
    assert request.stream is True
    assert request.capture.features == {
        "safety_settings": "honoured",
        "response_modalities": "honoured",
        "service_tier": "mapped",
        "store": "honoured",
    }
    assert "service_tier flex: one service tier here (standard)" in request.capture.notes
    assert PROVIDER.render_response(TEXT_COMPLETION, request)["service_tier"] == "standard"


@pytest.mark.conformance(feature="structured_output", api=API, status="mapped")
@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {
                "response_format": {
                    "type": "text",
                    "mime_type": "application/json",
                    "schema": {"type": "object"},
                }
            },
            ResponseFormat("json_schema", schema={"type": "object"}),
        ),
        (
            {"response_format": [{"type": "text", "mime_type": "application/json"}]},
            ResponseFormat("json_object"),
        ),
        (  # the legacy form: a bare schema with response_mime_type
            {"response_format": {"type": "object"}, "response_mime_type": "application/json"},
            ResponseFormat("json_schema", schema={"type": "object"}),
        ),
    ],
)
def test_structured_output_is_mapped_to_the_engines_response_format(
    fields: dict[str, Any], expected: ResponseFormat
) -> None:
    request = parse({"model": "g", "input": "hi", **fields})
    assert request.response_format == expected
    assert request.capture.features["structured_output"] == "mapped"


def test_tool_choice_names_one_allowed_function() -> None:
    choice = {"allowed_tools": {"mode": "any", "tools": ["shell"]}}
    request = parse(
        {
            "model": "g",
            "input": "hi",
            "tools": [SHELL],
            "generation_config": {"tool_choice": choice},
        }
    )
    assert request.tool_choice == {"type": "function", "function": {"name": "shell"}}


REFUSED: list[Any] = [
    pytest.param(
        {"tools": [{"type": "google_search"}]},
        "built-in tool 'google_search'",
        marks=pytest.mark.conformance(
            feature="server tools (web_search, ...)", api=API, status="refused"
        ),
        id="google_search",
    ),
    pytest.param({"tools": [{"type": "code_execution"}]}, "'code_execution'", id="code_execution"),
    pytest.param({"tools": [{"type": "url_context"}]}, "'url_context'", id="url_context"),
    pytest.param({"tools": [{"type": "mcp_server", "name": "m"}]}, "'mcp_server'", id="mcp_server"),
    pytest.param(
        {"tools": [{"type": "tool_search"}]},
        "'tool_search'",
        marks=pytest.mark.conformance(feature="tool search tools", api=API, status="refused"),
        id="tool_search",
    ),
    pytest.param(
        {"tools": [{**SHELL, "defer_loading": True}]},
        "defer_loading",
        marks=pytest.mark.conformance(feature="defer_loading", api=API, status="refused"),
        id="defer_loading",
    ),
    pytest.param(
        {"tools": [{**SHELL, "strict": True}]}, r"tools\[0\]\.strict", id="unknown_tool_field"
    ),
    pytest.param(
        {"agent": "deep-research-pro-preview-12-2025"}, "agent is not supported", id="agent"
    ),
    pytest.param({"agent_config": {"type": "dynamic"}}, "agent_config", id="agent_config"),
    pytest.param({"background": True}, "background is not supported", id="background"),
    pytest.param({"continuation_token": "t"}, "continuation_token", id="continuation_token"),
    pytest.param({"environment": "env_1"}, "environment", id="environment"),
    pytest.param(
        {"webhook_config": {"uris": ["https://x"]}}, "webhook_config", id="webhook_config"
    ),
    pytest.param({"response_modalities": ["image"]}, "response_modalities", id="modalities"),
    pytest.param(
        {"safety_settings": [{"type": "harassment", "threshold": "block_low_and_above"}]},
        "block_low_and_above",
        id="safety_settings",
    ),
    pytest.param(
        {"response_format": {"type": "audio"}},
        "response_format type 'audio'",
        marks=pytest.mark.conformance(
            feature="structured_output: other formats", api=API, status="refused"
        ),
        id="audio_format",
    ),
    pytest.param({"response_mime_type": "application/json"}, "needs a response_format", id="mime"),
    pytest.param({"generation_config": {"image_config": {}}}, "image_config", id="image_config"),
    pytest.param({"generation_config": {"speech_config": {}}}, "speech_config", id="speech_config"),
    pytest.param({"generation_config": {"top_k": 3}}, "generation_config.top_k", id="top_k"),
    pytest.param({"generation_config": {"thinking_level": "max"}}, "thinking_level", id="level"),
    pytest.param({"frequency_penalty": 1}, "Unknown parameter: frequency_penalty", id="unknown"),
    pytest.param(
        {"input": [{"type": "google_search_call", "id": "s", "arguments": {}}]},
        "'google_search_call' step belongs to a built-in tool",
        id="builtin_step",
    ),
    pytest.param(
        {"input": [{"type": "audio", "data": "AAAA", "mime_type": "audio/wav"}]},
        "audio content is not supported",
        id="audio_input",
    ),
    pytest.param(
        {"input": [{"type": "image", "uri": "u", "resolution": "high"}]},
        "resolution",
        id="image_resolution",
    ),
    pytest.param(
        {
            "input": [
                {"type": "function_call", "id": "c", "name": "shell", "arguments": {}},
                {
                    "type": "function_result",
                    "call_id": "c",
                    "result": [{"type": "image", "uri": "u"}],
                },
            ]
        },
        "cannot ride in a tool message",
        id="image_result",
    ),
    pytest.param(
        {"input": ""},
        "input is required",
        marks=pytest.mark.conformance(feature="empty input", api=API, status="refused"),
        id="empty_input",
    ),
    pytest.param({"model": None}, "model is required", id="no_model"),
    pytest.param(
        {
            "tools": [SHELL, {**SHELL, "name": "read"}, {**SHELL, "name": "write"}],
            "generation_config": {
                "tool_choice": {"allowed_tools": {"mode": "any", "tools": ["shell", "read"]}}
            },
        },
        "some but not all",
        marks=pytest.mark.conformance(
            feature="tool_choice allowed_tools, some of the tools", api=API, status="refused"
        ),
        id="allowed_some",
    ),
]


@pytest.mark.parametrize(("fields", "match"), REFUSED)
def test_what_cannot_run_here_is_refused_by_name(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        parse({"model": "g", "input": "hi", **fields})


@pytest.mark.conformance(feature="cachedContent", api=API, status="refused")
def test_cached_content_is_refused_by_name_never_ignored() -> None:
    with pytest.raises(NotFound, match="cached_content 'cachedContents/x' not found"):
        parse({"model": "g", "input": "hi", "cached_content": "cachedContents/x"})


def test_the_legacy_outputs_revision_is_refused_by_name() -> None:
    with pytest.raises(InvalidRequest, match="Api-Revision 2026-05-07: the legacy outputs"):
        parse({"model": "g", "input": "hi"}, headers={"api-revision": "2026-05-07"})
    assert parse({"model": "g", "input": "hi"}, headers={"api-revision": "2026-05-20"})


def test_refusals_reach_the_sdk_as_its_client_error() -> None:
    client = sdk_client(Gateway(lambda _: TEXT_COMPLETION))
    with pytest.raises(BadRequestError, match="built-in tool 'google_search'") as refused:
        client.interactions.create(model="g", input="hi", tools=[{"type": "google_search"}])
    assert refused.value.status_code == 400


# --------------------------------------------------------------------------- stream


def test_sdk_reads_the_stream_event_by_event() -> None:
    gateway = Gateway(lambda _: CALL_COMPLETION)
    events = list(
        sdk_client(gateway).interactions.create(
            model="g", input="files?", tools=[SHELL], stream=True
        )
    )
    assert gateway.requests[0].stream is True
    assert [(e.event_type, getattr(e, "index", None)) for e in events] == [
        ("interaction.created", None),
        ("step.start", 0),
        ("step.delta", 0),
        ("step.delta", 0),
        ("step.stop", 0),
        ("step.start", 1),
        ("step.delta", 1),
        ("step.stop", 1),
        ("step.start", 2),
        ("step.delta", 2),
        ("step.stop", 2),
        ("interaction.completed", None),
    ]
    created, completed = events[0], events[-1]
    assert created.interaction.id == completed.interaction.id == "v1_abc123"
    assert created.interaction.status == "in_progress"
    assert completed.interaction.status == "requires_action"
    assert completed.interaction.usage.total_output_tokens == 12
    summary, signature = events[2].delta, events[3].delta
    assert summary.content.text == CALL_COMPLETION.reasoning
    assert decode_reasoning_b64(signature.signature) == CALL_COMPLETION.reasoning
    assert events[6].delta.text == "Listing. ✓"
    call = events[8].step
    assert (call.type, call.id, call.name) == ("function_call", "call_1", "shell")
    assert orjson.loads(events[9].delta.arguments) == {"command": "ls", "n": [1, 2.5]}


def test_the_stream_error_is_the_sdks_error_event() -> None:
    frame = PROVIDER.stream_error(EngineTimeout("the engine took too long"))
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    event = ErrorEvent.model_validate(orjson.loads(frame.removeprefix(b"data: ")))
    assert event.error is not None
    assert (event.error.code, event.error.message) == (
        "deadline_exceeded",
        "the engine took too long",
    )


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidRequest("x"), "invalid_request"),
        (AuthenticationFailed("x"), "authentication"),
        (NotFound("x"), "not_found"),
        (RateLimited("x"), "rate_limit_exceeded"),
        (EngineError("x"), "api_error"),
        (EngineUnavailable("x"), "service_unavailable"),
        (EngineTimeout("x"), "deadline_exceeded"),
        (GatewayError("x"), "api_error"),
    ],
)
def test_error_codes_are_the_apis_own(error: GatewayError, code: str) -> None:
    assert PROVIDER.error_body(error) == {"error": {"code": code, "message": "x"}}


def test_a_context_error_names_both_counts() -> None:
    body = PROVIDER.error_body(ContextLengthExceeded(prompt_tokens=9000, limit=8192))
    assert body["error"]["message"] == (
        "The input token count (9000) exceeds the maximum number of tokens allowed (8192)."
    )


# --------------------------------------------------------------------------- stored interactions


def test_the_stored_interaction_is_the_whole_timeline() -> None:
    request = parse({"model": "g", "input": "files?", "tools": [SHELL]})
    kept = PROVIDER.reply_to_store(CALL_COMPLETION, request)
    assert kept is not None
    reply_id, body = kept
    assert reply_id == body["id"] == PROVIDER.render_response(CALL_COMPLETION, request)["id"]
    steps = Interaction.model_validate(body).steps or []
    assert [s.type for s in steps] == ["user_input", "thought", "model_output", "function_call"]
    assert PROVIDER.render_response(CALL_COMPLETION, request)["steps"] == body["steps"][1:]


def test_a_continuation_puts_the_kept_context_first_without_its_system_instruction() -> None:
    request = parse(
        {
            "model": "g",
            "input": "more",
            "system_instruction": "New.",
            "previous_interaction_id": "v1_a",
        }
    )
    assert PROVIDER.continues(request) == "v1_a"
    earlier = [
        {"role": "system", "content": "Old."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    PROVIDER.continue_after(request, earlier, {"system_instruction": "Old."})
    assert request.messages == [
        {"role": "system", "content": "New."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "more"},
    ]
    assert request.capture.features["previous_interaction_id"] == "honoured"
    assert isinstance(request.adapter_state, InteractionsState)


@pytest.mark.parametrize(
    ("method", "path", "query", "match"),
    [
        ("POST", "/v1/interactions/v1_a/cancel", {}, "cancel applies to background"),
        ("GET", "/v1/interactions/v1_a", {"stream": "true"}, "stream"),
        ("GET", "/v1/interactions/v1_a", {"last_event_id": "e1"}, "last_event_id"),
        ("GET", "/v1/interactions/v1_a", {"include_input": "true"}, "include_input"),
    ],
)
def test_what_a_get_cannot_be_answered_with_is_refused_by_name(
    method: str, path: str, query: dict[str, str], match: str
) -> None:
    with pytest.raises(InvalidRequest, match=match):
        PROVIDER.reply_id(RequestContext(path=path, method=method, query=query))


def test_unknown_ids_and_deletes_answer_in_the_apis_shape() -> None:
    assert PROVIDER.reply_id(RequestContext(path="/v1/interactions/v1_a", method="GET")) == "v1_a"
    assert PROVIDER.deleted("v1_a") == {}
    continued = PROVIDER.not_found("v1_a", continued=True)
    fetched = PROVIDER.not_found("v1_a", continued=False)
    assert (continued.status, continued.message) == (
        400,
        "Previous interaction with id 'v1_a' not found.",
    )
    assert (fetched.status, fetched.message) == (404, "Interaction with id 'v1_a' not found.")

    def missing(_: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json=PROVIDER.error_body(fetched))

    with pytest.raises(NotFoundError, match="Interaction with id 'v1_a' not found"):
        sdk_client(missing).interactions.get("v1_a")


def test_the_signature_round_trips_base64_wrapped() -> None:
    assert decode_reasoning_b64(encode_reasoning_b64("why ✓")) == "why ✓"
    assert decode_reasoning_b64("Zm9yZWlnbg==") is None
