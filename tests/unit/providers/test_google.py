"""The Google generateContent adapter, checked against the official google-genai SDK.

The SDK talks to the adapter through an ``httpx.MockTransport`` (``HttpOptions(httpx_client=...)``),
so its own request builder, SSE reader, response models and error classes judge our wire shapes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import orjson
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from polar.errors import (
    AuthenticationFailed,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    GatewayError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    RateLimited,
)
from polar.providers.base import COUNT_TOKENS, GENERATE, RequestContext
from polar.providers.google import GoogleProvider, GoogleState
from polar.providers.reasoning_codec import encode_reasoning
from polar.providers.types import Completion, NormalizedRequest, SamplingParams, ToolCall

PROVIDER = GoogleProvider()
GEN_PATH = "/v1beta/models/gemini-2.5-pro:generateContent"
STREAM_PATH = "/v1beta/models/gemini-2.5-pro:streamGenerateContent"


def ctx(path: str = GEN_PATH, **query: str) -> RequestContext:
    return RequestContext(path=path, query=query, headers={"x-goog-api-key": "sess"})


def parse(body: Any, path: str = GEN_PATH) -> NormalizedRequest:
    return PROVIDER.parse_request(body, ctx(path))


def signature(reasoning: str) -> str:
    """What our renderer puts in ``thoughtSignature``: the reasoning blob, base64-wrapped."""
    return base64.b64encode(encode_reasoning(reasoning).encode()).decode()


# A request as Gemini CLI sends it on its second turn (after one tool call), trimmed.
GEMINI_CLI_BODY: dict[str, Any] = {
    "contents": [
        {"role": "user", "parts": [{"text": "This is the Gemini CLI. Context: cwd /work"}]},
        {"role": "user", "parts": [{"text": "List the files here."}]},
        {
            "role": "model",
            "parts": [
                {"text": "Let me look.", "thoughtSignature": signature("User wants a listing.")},
                {
                    "functionCall": {"name": "list_directory", "args": {"dir_path": "/work"}},
                    "thoughtSignature": "Q2lRQmNoMmx2Z0ZvcmVpZ24=",
                },
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": "list_directory-1732170000000-abc",
                        "name": "list_directory",
                        "response": {"output": "a.py\nb.py"},
                    }
                }
            ],
        },
    ],
    "systemInstruction": {
        "role": "user",
        "parts": [{"text": "You are an interactive CLI agent."}, {"text": "Be concise."}],
    },
    "tools": [
        {
            "functionDeclarations": [
                {
                    "name": "list_directory",
                    "description": "Lists a directory.",
                    "parametersJsonSchema": {
                        "type": "object",
                        "properties": {"dir_path": {"type": "string"}},
                        "required": ["dir_path"],
                    },
                },
                {"name": "read_file", "description": "Reads a file."},
            ]
        }
    ],
    "generationConfig": {
        "temperature": 1,
        "topP": 0.95,
        "topK": 64,
        "thinkingConfig": {"includeThoughts": True, "thinkingBudget": 8192},
    },
}


# --- parsing ------------------------------------------------------------------------------------


def test_gemini_cli_request_normalizes_exactly() -> None:
    req = PROVIDER.parse_request(GEMINI_CLI_BODY, ctx(STREAM_PATH, alt="sse"))

    assert req.provider == "google"
    assert req.model == "gemini-2.5-pro"
    assert req.stream is True
    assert req.messages == [
        {"role": "system", "content": "You are an interactive CLI agent.\nBe concise."},
        {"role": "user", "content": "This is the Gemini CLI. Context: cwd /work"},
        {"role": "user", "content": "List the files here."},
        {
            "role": "assistant",
            "content": "Let me look.",
            # Our own signature carried the reasoning; the foreign one is dropped.
            "reasoning": "User wants a listing.",
            "tool_calls": [
                {
                    "id": "call_2_0",
                    "type": "function",
                    "function": {"name": "list_directory", "arguments": '{"dir_path":"/work"}'},
                }
            ],
        },
        # Gemini CLI invents its own response id for an id-less call: matched by name.
        {"role": "tool", "tool_call_id": "call_2_0", "content": '{"output":"a.py\\nb.py"}'},
    ]
    assert req.tools == [
        {
            "type": "function",
            "function": {
                "name": "list_directory",
                "description": "Lists a directory.",
                "parameters": {
                    "type": "object",
                    "properties": {"dir_path": {"type": "string"}},
                    "required": ["dir_path"],
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Reads a file.",
                "parameters": {"type": "object", "properties": {}},
            },
        },
    ]
    assert req.tool_choice is None
    assert req.params == SamplingParams(temperature=1.0, top_p=0.95, top_k=64)
    assert req.dropped_tools == []
    assert req.requested_model == "gemini-2.5-pro"
    assert req.adapter_state == GoogleState(include_thoughts=True)


def test_openapi_parameters_become_json_schema() -> None:
    body = {
        "contents": [{"parts": [{"text": "hi"}]}],
        "tools": [
            {
                "function_declarations": [
                    {
                        "name": "edit",
                        "parameters": {
                            "type": "OBJECT",
                            "properties": {
                                "file_path": {"type": "STRING", "description": "where"},
                                "count": {"type": "INTEGER", "nullable": True, "minimum": 0},
                                "tags": {"type": "ARRAY", "items": {"type": "STRING"}},
                                "mode": {"any_of": [{"type": "STRING"}, {"type": "NUMBER"}]},
                                "opts": {"type": "OBJECT", "ref": "#/defs/o"},
                            },
                            "required": ["file_path"],
                            "propertyOrdering": ["file_path", "count"],
                            "defs": {"o": {"type": "BOOLEAN"}},
                        },
                    }
                ]
            }
        ],
    }
    (tool,) = parse(body).tools
    assert tool["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "file_path": {"type": "string", "description": "where"},
            "count": {"type": ["integer", "null"], "minimum": 0},
            "tags": {"type": "array", "items": {"type": "string"}},
            "mode": {"anyOf": [{"type": "string"}, {"type": "number"}]},
            "opts": {"type": "object", "$ref": "#/defs/o"},
        },
        "required": ["file_path"],
        "$defs": {"o": {"type": "boolean"}},
    }


@pytest.mark.conformance(feature="server tools (web_search, ...)", api="google", status="refused")
@pytest.mark.parametrize(
    ("tool", "name"),
    [
        ({"googleSearch": {}}, "googleSearch"),
        ({"code_execution": {}}, "codeExecution"),
        ({"urlContext": {}, "functionDeclarations": [{"name": "f"}]}, "urlContext"),
        ({"googleSearchRetrieval": {"dynamicRetrievalConfig": {}}}, "googleSearchRetrieval"),
    ],
)
def test_builtin_tools_are_refused_by_name_not_dropped(tool: dict[str, Any], name: str) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "tools": [tool]}
    with pytest.raises(InvalidRequest, match=f"built-in tool '{name}'"):
        parse(body)


@pytest.mark.conformance(feature="cachedContent", api="google", status="refused")
def test_cached_content_is_refused_by_name_never_ignored() -> None:
    body = {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "cachedContent": "cachedContents/abc",
    }
    with pytest.raises(NotFound, match="cachedContents/abc") as caught:
        parse(body)
    assert PROVIDER.error_body(caught.value)["error"] == {
        "code": 404,
        "message": caught.value.message,
        "status": "NOT_FOUND",
    }


@pytest.mark.parametrize(
    ("config", "choice"),
    [
        ({"mode": "AUTO"}, "auto"),
        ({"mode": "ANY"}, "required"),
        ({"mode": "NONE"}, "none"),
        ({"mode": "VALIDATED"}, "auto"),
        (
            {"mode": "ANY", "allowedFunctionNames": ["g"]},
            {"type": "function", "function": {"name": "g"}},
        ),
        ({"mode": "ANY", "allowed_function_names": ["f", "g"]}, "required"),
        ({"mode": "MODE_UNSPECIFIED"}, None),
        ({}, None),
    ],
)
def test_tool_config_maps_to_tool_choice(config: dict[str, Any], choice: Any) -> None:
    body = {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "tools": [{"functionDeclarations": [{"name": "f"}, {"name": "g"}]}],
        "toolConfig": {"functionCallingConfig": config},
    }
    assert parse(body).tool_choice == choice


def test_allowed_names_naming_a_subset_are_refused_by_name_not_widened() -> None:
    body = {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "tools": [{"functionDeclarations": [{"name": "f"}, {"name": "g"}, {"name": "h"}]}],
        "toolConfig": {
            "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f", "g"]}
        },
    }
    with pytest.raises(InvalidRequest, match="allowedFunctionNames naming some but not all"):
        parse(body)


def test_tool_choice_stays_unset_without_tools() -> None:
    body = {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "tools": [],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
    }
    req = parse(body)
    assert req.tool_choice is None
    assert "tool_choice" not in req.chat_body()


def test_call_ids_derive_from_position_and_results_match_by_id_then_name() -> None:
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "go"}]},
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "read", "args": {"p": "a"}}},
                    {"functionCall": {"name": "read", "args": {"p": "b"}}},
                    {"functionCall": {"name": "grep", "args": {}, "id": "given_1"}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "grep", "id": "given_1", "response": {"n": 1}}},
                    {"functionResponse": {"name": "read", "response": {"t": "A"}}},
                    {"functionResponse": {"name": "read", "response": {"t": "B"}}},
                    {"functionResponse": {"name": "ghost", "response": {}}},
                    {"functionResponse": {"name": "ghost2", "id": "orphan", "response": {}}},
                    {"text": "and now?"},
                ],
            },
        ]
    }
    messages = parse(body).messages
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["call_1_0", "call_1_1", "given_1"]
    assert messages[2:] == [
        {"role": "tool", "tool_call_id": "given_1", "content": '{"n":1}'},
        {"role": "tool", "tool_call_id": "call_1_0", "content": '{"t":"A"}'},
        {"role": "tool", "tool_call_id": "call_1_1", "content": '{"t":"B"}'},
        {"role": "tool", "tool_call_id": "call_2_3", "content": "{}"},
        {"role": "tool", "tool_call_id": "orphan", "content": "{}"},
        {"role": "user", "content": "and now?"},
    ]
    # Deterministic: the same history normalizes identically on every replay.
    assert parse(body).messages == messages


def test_thought_parts_win_over_signatures_and_foreign_blobs_are_dropped() -> None:
    thought_turn = {
        "role": "model",
        "parts": [
            {"text": "visible thinking", "thought": True, "thoughtSignature": signature("other")},
            {"text": "answer"},
        ],
    }
    bare_blob_turn = {
        "role": "model",
        "parts": [{"text": "x", "thought_signature": encode_reasoning("bare")}],
    }
    foreign_turn = {"role": "model", "parts": [{"text": "y", "thoughtSignature": "c2lnbmF0dXJl"}]}
    unpadded = base64.urlsafe_b64encode(encode_reasoning("ok?").encode()).rstrip(b"=").decode()
    urlsafe_turn = {"role": "model", "parts": [{"text": "z", "thoughtSignature": unpadded}]}
    body = {
        "contents": [
            {"parts": [{"text": "q"}]},
            thought_turn,
            {"parts": [{"text": "q2"}]},
            bare_blob_turn,
            {"parts": [{"text": "q3"}]},
            foreign_turn,
            {"parts": [{"text": "q4"}]},
            urlsafe_turn,
        ]
    }
    messages = parse(body).messages
    assert messages[1] == {
        "role": "assistant",
        "content": "answer",
        "reasoning": "visible thinking",
    }
    assert messages[3] == {"role": "assistant", "content": "x", "reasoning": "bare"}
    assert messages[5] == {"role": "assistant", "content": "y"}
    assert messages[7] == {"role": "assistant", "content": "z", "reasoning": "ok?"}


def test_media_code_and_string_system_instruction() -> None:
    body = {
        "system_instruction": "Be brief.",
        "contents": [
            {
                "parts": [
                    {"text": "what is this?"},
                    {"inline_data": {"mime_type": "image/png", "data": "iVBORw0KGgo="}},
                    {
                        "fileData": {
                            "fileUri": "https://example.com/x.jpg",
                            "mimeType": "image/jpeg",
                        }
                    },
                ]
            },
            {
                "role": "model",
                "parts": [
                    {"executableCode": {"language": "PYTHON", "code": "print(1)"}},
                    {"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "1\n"}},
                ],
            },
        ],
    }
    assert parse(body).messages == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "image_url", "image_url": {"url": "https://example.com/x.jpg"}},
            ],
        },
        {"role": "assistant", "content": "```python\nprint(1)\n```\n1\n"},
    ]


def test_generation_config_in_snake_case() -> None:
    body = {
        "contents": [{"parts": [{"text": "hi"}]}],
        "generation_config": {
            "max_output_tokens": 256,
            "temperature": 0.2,
            "top_p": 0.9,
            "top_k": 20,
            "stop_sequences": ["END"],
            "seed": 7,
            "candidate_count": 1,
            "response_mime_type": "text/plain",
        },
    }
    req = parse(body)
    assert req.params == SamplingParams(
        max_tokens=256, temperature=0.2, top_p=0.9, top_k=20, stop=["END"], seed=7
    )
    assert req.requested_model == "gemini-2.5-pro"
    assert req.adapter_state == GoogleState(include_thoughts=False)
    assert req.stream is False


@pytest.mark.parametrize(
    ("path", "op", "model"),
    [
        ("/v1beta/models/gemini-2.5-pro:generateContent", GENERATE, "gemini-2.5-pro"),
        ("/v1/models/m1:streamGenerateContent", GENERATE, "m1"),
        ("/v1/v1beta/models/m1:countTokens", COUNT_TOKENS, "m1"),
        ("/api/v1beta/models/Qwen/Qwen3-8B:generateContent", GENERATE, "Qwen/Qwen3-8B"),
        ("/v1beta/models/my%20model%3AstreamGenerateContent", GENERATE, "my model"),
        ("/v1/projects/p/locations/l/publishers/google/models/g:generateContent", GENERATE, "g"),
        ("/models/bare:generateContent", GENERATE, "bare"),
        ("/v1beta/models/m1", None, None),
        ("/v1/chat/completions", None, None),
        ("/v1/messages", None, None),
    ],
)
def test_paths_choose_operation_and_model(path: str, op: str | None, model: str | None) -> None:
    assert PROVIDER.operation(ctx(path)) == op
    if model is not None:
        req = parse({"contents": [{"parts": [{"text": "hi"}]}]}, path)
        assert req.model == model
        assert req.stream == path.endswith("streamGenerateContent")


def test_count_tokens_accepts_wrapped_request_and_renders_total() -> None:
    path = "/v1beta/models/m1:countTokens"
    wrapped = {
        "generateContentRequest": {
            "model": "models/m1",
            "contents": [{"role": "user", "parts": [{"text": "count me"}]}],
            "systemInstruction": {"parts": [{"text": "sys"}]},
        }
    }
    req = parse(wrapped, path)
    assert req.messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "count me"},
    ]
    assert PROVIDER.render_token_count(12) == {"totalTokens": 12}


def test_model_falls_back_to_body_on_unclaimed_paths() -> None:
    req = parse({"model": "models/m2", "contents": [{"parts": [{"text": "hi"}]}]}, "/custom")
    assert req.model == "m2"
    assert req.stream is False


def test_detection_by_headers_and_body() -> None:
    assert PROVIDER.matches_headers({"x-goog-api-key": "k"})
    assert not PROVIDER.matches_headers({"authorization": "Bearer k"})
    assert PROVIDER.matches_body({"contents": []})
    assert not PROVIDER.matches_body({"messages": []})
    assert not PROVIDER.matches_body(["contents"])


@pytest.mark.parametrize(
    "body",
    [
        [],
        {},
        {"contents": []},
        {"contents": {"parts": []}},
        {"contents": [{"role": "model", "parts": []}]},
        {"contents": [{"role": "assistant", "parts": [{"text": "hi"}]}]},
        {"contents": [{"parts": [{"text": 5}]}]},
        {"contents": [{"parts": [7]}]},
        {"contents": [{"parts": [{"functionCall": {"args": {}}}]}]},
        {"contents": [{"role": "model", "parts": [{"functionCall": {"name": "f", "args": [1]}}]}]},
        {"contents": [{"parts": [{"functionResponse": {"name": "f", "id": 3}}]}]},
        {"contents": [{"parts": [{"inlineData": {"mimeType": "image/png"}}]}]},
        {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"candidateCount": 2}},
        {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"temperature": "hot"}},
        {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"stopSequences": [1]}},
        {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": []},
        {"contents": [{"parts": [{"text": "hi"}]}], "systemInstruction": 3},
        {"contents": [{"parts": [{"text": "hi"}]}], "tools": [{"functionDeclarations": [{}]}]},
        {
            "contents": [{"parts": [{"text": "hi"}]}],
            "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": 1}}]}],
        },
        {
            "contents": [{"parts": [{"text": "hi"}]}],
            "tools": [{"functionDeclarations": [{"name": "f"}]}],
            "toolConfig": {"functionCallingConfig": {"mode": 1}},
        },
    ],
)
def test_malformed_requests_raise_invalid_request(body: Any) -> None:
    with pytest.raises(InvalidRequest):
        parse(body)


@pytest.mark.parametrize(
    ("error", "code", "status"),
    [
        (InvalidRequest("bad field"), 400, "INVALID_ARGUMENT"),
        (AuthenticationFailed("no session"), 401, "UNAUTHENTICATED"),
        (NotFound("no route"), 404, "NOT_FOUND"),
        (PayloadTooLarge("too big"), 413, "INVALID_ARGUMENT"),
        (RateLimited("slow down"), 429, "RESOURCE_EXHAUSTED"),
        (EngineError("engine broke"), 502, "INTERNAL"),
        (EngineUnavailable("paused"), 503, "UNAVAILABLE"),
        (EngineTimeout("slow engine"), 504, "DEADLINE_EXCEEDED"),
        (GatewayError("oops"), 500, "INTERNAL"),
    ],
)
def test_error_body_uses_google_statuses(error: GatewayError, code: int, status: str) -> None:
    assert PROVIDER.error_body(error) == {
        "error": {"code": code, "message": error.message, "status": status}
    }


# --- rendering through the official SDK ---------------------------------------------------------

Engine = Callable[[NormalizedRequest], Completion]


class Gateway:
    """The adapter's half of the gateway, as an httpx transport handler; records what it parsed."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.requests: list[NormalizedRequest] = []
        self.paths: list[str] = []
        self.queries: list[Mapping[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        context = RequestContext(
            path=request.url.path,
            method=request.method,
            query=dict(request.url.params),
            headers={k.lower(): v for k, v in request.headers.items()},
        )
        self.paths.append(request.url.path)
        self.queries.append(context.query)
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
    transport = httpx.MockTransport(handler)
    options = types.HttpOptions(
        base_url="http://gateway/s/session-key",
        api_version="v1beta",  # what Gemini CLI uses
        httpx_client=httpx.Client(transport=transport),
    )
    return genai.Client(api_key="session-key", http_options=options)


TOOL = types.Tool(
    function_declarations=[
        types.FunctionDeclaration(
            name="read_file",
            description="Read a file",
            parameters_json_schema={"type": "object", "properties": {"path": {"type": "string"}}},
        )
    ]
)
THINKING = types.GenerateContentConfig(
    tools=[TOOL], thinking_config=types.ThinkingConfig(include_thoughts=True)
)
CALL_COMPLETION = Completion(
    id="resp-1",
    model="engine-model-name",
    content="I will read it. ✓ ü",
    reasoning="The user wants file contents; call read_file.",
    tool_calls=[
        ToolCall(id="call_abc", name="read_file", arguments='{"path": "a.py", "n": [1, 2.5]}')
    ],
    finish_reason="tool_calls",
    prompt_tokens=40,
    completion_tokens=12,
)


def test_sdk_reads_non_streaming_reply_with_tool_call_reasoning_and_usage() -> None:
    gateway = Gateway(lambda _: CALL_COMPLETION)
    client = sdk_client(gateway)
    reply = client.models.generate_content(
        model="gemini-2.5-pro", contents="read a.py", config=THINKING
    )

    assert gateway.paths == ["/s/session-key/v1beta/models/gemini-2.5-pro:generateContent"]
    assert gateway.requests[0].adapter_state == GoogleState(include_thoughts=True)
    (candidate,) = reply.candidates or []
    assert candidate.finish_reason == types.FinishReason.STOP
    parts = candidate.content.parts if candidate.content and candidate.content.parts else []
    assert [(p.thought, p.text) for p in parts[:2]] == [
        (True, CALL_COMPLETION.reasoning),
        (None, CALL_COMPLETION.content),
    ]
    assert reply.text == CALL_COMPLETION.content
    (call,) = reply.function_calls or []
    assert (call.id, call.name, call.args) == (
        "call_abc",
        "read_file",
        {"path": "a.py", "n": [1, 2.5]},
    )
    assert parts[2].thought_signature == encode_reasoning(CALL_COMPLETION.reasoning or "").encode()
    usage = reply.usage_metadata
    assert usage is not None
    assert (usage.prompt_token_count, usage.candidates_token_count, usage.total_token_count) == (
        40,
        12,
        52,
    )
    assert reply.model_version == "gemini-2.5-pro"
    assert reply.response_id == "resp-1"


def test_tool_call_round_trip_keeps_id_arguments_and_reasoning() -> None:
    gateway = Gateway(lambda _: CALL_COMPLETION)
    client = sdk_client(gateway)
    first = client.models.generate_content(
        model="gemini-2.5-pro", contents="read a.py", config=THINKING
    )
    model_turn = (first.candidates or [])[0].content
    assert model_turn is not None and model_turn.parts
    # Gemini clients keep the model turn minus its thought parts, then answer the call.
    model_turn.parts = [p for p in model_turn.parts if not p.thought]
    result = types.Part.from_function_response(name="read_file", response={"output": "print(1)"})
    client.models.generate_content(
        model="gemini-2.5-pro",
        contents=[
            types.Content(role="user", parts=[types.Part(text="read a.py")]),
            model_turn,
            types.Content(role="user", parts=[result]),
        ],
        config=THINKING,
    )

    assert gateway.requests[1].messages == [
        {"role": "user", "content": "read a.py"},
        {
            "role": "assistant",
            "content": CALL_COMPLETION.content,
            "reasoning": CALL_COMPLETION.reasoning,
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path":"a.py","n":[1,2.5]}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": '{"output":"print(1)"}'},
    ]


def test_sdk_reads_stream_chunk_by_chunk() -> None:
    gateway = Gateway(lambda _: CALL_COMPLETION)
    client = sdk_client(gateway)
    chunks = list(
        client.models.generate_content_stream(
            model="gemini-2.5-pro", contents="read a.py", config=THINKING
        )
    )

    assert gateway.paths == ["/s/session-key/v1beta/models/gemini-2.5-pro:streamGenerateContent"]
    assert gateway.queries == [{"alt": "sse"}]
    assert gateway.requests[0].stream is True
    assert len(chunks) == 3
    parts = [p for c in chunks for p in ((c.candidates or [])[0].content.parts or [])]  # type: ignore[union-attr]
    assert parts[0].thought is True and parts[0].text == CALL_COMPLETION.reasoning
    assert "".join(c.text or "" for c in chunks) == CALL_COMPLETION.content
    (call,) = chunks[2].function_calls or []
    assert (call.id, call.name, call.args) == (
        "call_abc",
        "read_file",
        {"path": "a.py", "n": [1, 2.5]},
    )
    assert parts[2].thought_signature == encode_reasoning(CALL_COMPLETION.reasoning or "").encode()
    finishes = [(c.candidates or [])[0].finish_reason for c in chunks]
    assert finishes == [None, None, types.FinishReason.STOP]
    assert [c.usage_metadata is not None for c in chunks] == [False, False, True]
    assert chunks[2].usage_metadata.total_token_count == 52  # type: ignore[union-attr]


def test_stream_frames_are_bare_data_lines() -> None:
    request = parse({"contents": [{"parts": [{"text": "hi"}]}]}, STREAM_PATH)
    frames = PROVIDER.render_stream(Completion(id="r", model="m", content="hello"), request)
    assert frames == [
        b'data: {"candidates":[{"content":{"role":"model","parts":[{"text":"hello"}]},"index":0,'
        b'"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":0,"candidatesTokenCount":0,'
        b'"totalTokenCount":0},"modelVersion":"gemini-2.5-pro","responseId":"r"}\n\n'
    ]


def test_hidden_thoughts_still_travel_in_the_signature() -> None:
    completion = Completion(id="r", model="m", content="", reasoning="secret plan")
    gateway = Gateway(lambda _: completion)
    reply = sdk_client(gateway).models.generate_content(model="m", contents="hi")
    parts = (reply.candidates or [])[0].content.parts or []  # type: ignore[union-attr]
    assert [(p.text, p.thought) for p in parts] == [("", None)]
    assert parts[0].thought_signature == encode_reasoning("secret plan").encode()


@pytest.mark.parametrize(
    ("finish", "expected"),
    [
        ("stop", types.FinishReason.STOP),
        ("length", types.FinishReason.MAX_TOKENS),
        ("tool_calls", types.FinishReason.STOP),
        ("content_filter", types.FinishReason.SAFETY),
    ],
)
def test_finish_reasons_map_to_gemini_vocabulary(finish: str, expected: types.FinishReason) -> None:
    completion = Completion(id="r", model="m", content="x", finish_reason=finish)
    reply = sdk_client(Gateway(lambda _: completion)).models.generate_content(
        model="m", contents="hi"
    )
    assert (reply.candidates or [])[0].finish_reason == expected


def error_handler(error: GatewayError) -> Callable[[httpx.Request], httpx.Response]:
    return lambda _: httpx.Response(error.status, json=PROVIDER.error_body(error))


def test_sdk_raises_client_error_with_our_message() -> None:
    client = sdk_client(error_handler(InvalidRequest("contents is required")))
    with pytest.raises(genai_errors.ClientError) as caught:
        client.models.generate_content(model="m", contents="hi")
    assert (caught.value.code, caught.value.status, caught.value.message) == (
        400,
        "INVALID_ARGUMENT",
        "contents is required",
    )


def test_sdk_raises_server_error_with_our_message() -> None:
    client = sdk_client(error_handler(EngineUnavailable("engine paused for weight sync")))
    with pytest.raises(genai_errors.ServerError) as caught:
        client.models.generate_content(model="m", contents="hi")
    assert (caught.value.code, caught.value.status, caught.value.message) == (
        503,
        "UNAVAILABLE",
        "engine paused for weight sync",
    )


def test_real_parse_failure_reaches_the_sdk_as_client_error() -> None:
    client = sdk_client(Gateway(lambda _: CALL_COMPLETION))
    config = types.GenerateContentConfig(candidate_count=2)
    with pytest.raises(genai_errors.ClientError) as caught:
        client.models.generate_content(model="m", contents="hi", config=config)
    assert caught.value.code == 400
    assert "candidateCount" in (caught.value.message or "")


def test_render_echoes_requested_model_and_json_round_trips() -> None:
    request = parse(
        {"contents": [{"parts": [{"text": "hi"}]}]}, "/v1beta/models/asked:generateContent"
    )
    body = PROVIDER.render_response(CALL_COMPLETION, request)
    assert body["modelVersion"] == "asked"
    assert json.loads(orjson.dumps(body)) == body
