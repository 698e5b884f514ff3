"""The Anthropic Messages adapter, checked against the official ``anthropic`` SDK's own parsers."""

from __future__ import annotations

import copy
import json
from typing import Any

import anthropic
import httpx2
import orjson
import pytest

from polar.errors import (
    AuthenticationFailed,
    EngineError,
    EngineRejected,
    EngineTimeout,
    EngineUnavailable,
    GatewayError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    RateLimited,
)
from polar.providers.anthropic import AnthropicProvider
from polar.providers.base import COUNT_TOKENS, GENERATE, RequestContext
from polar.providers.reasoning_codec import encode_reasoning
from polar.providers.types import CaptureTags, Completion, NormalizedRequest, ToolCall

PROVIDER = AnthropicProvider()
CTX = RequestContext(path="/v1/messages", headers={"anthropic-version": "2023-06-01"})

BILLING = "x-anthropic-billing-header: cc_version=2.1.197.a1b; cc_entrypoint=sdk-cli; cch=4f2e1;"
BASH_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
    "required": ["command"],
    "additionalProperties": False,
}
READ_SCHEMA = {"type": "object", "properties": {"file_path": {"type": "string"}}}


def claude_code_body(billing: str = BILLING) -> dict[str, Any]:
    """A request shaped like Claude Code's: billing line, system role inside messages, ..."""
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "stream": True,
        "temperature": 1,
        "metadata": {"user_id": "user_abc_account__session_123"},
        "thinking": {"type": "adaptive"},
        "system": [
            {"type": "text", "text": billing},
            {
                "type": "text",
                "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                "cache_control": {"type": "ephemeral"},
            },
            {
                "type": "text",
                "text": "Use the tools available to you.",
                "cache_control": {"type": "ephemeral", "ttl": "1h"},
            },
        ],
        "messages": [
            {"role": "system", "content": "Current date: 2026-01-01."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>\nBe brief.\n</system-reminder>"},
                    {
                        "type": "text",
                        "text": "List the files.",
                        "cache_control": {"type": "ephemeral"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "thinking",
                        "thinking": "I should run ls.",
                        "signature": encode_reasoning("I should run ls."),
                    },
                    {"type": "text", "text": "Listing."},
                    {
                        "type": "tool_use",
                        "id": "toolu_01",
                        "name": "Bash",
                        "input": {"command": "ls", "timeout": 5},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01",
                        "content": [
                            {"type": "text", "text": "a.py"},
                            {"type": "text", "text": "b.py"},
                        ],
                        "cache_control": {"type": "ephemeral"},
                    },
                    {"type": "text", "text": "Now read a.py"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_02",
                        "name": "Read",
                        "input": {"file_path": "/w/a.py"},
                    },
                    {
                        "type": "tool_use",
                        "id": "toolu_03",
                        "name": "Read",
                        "input": {"file_path": "/w/c.py"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_02", "content": "print(1)"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_03",
                        "content": [{"type": "text", "text": "File does not exist."}],
                        "is_error": True,
                    },
                ],
            },
        ],
        "tools": [
            {"name": "Bash", "description": "Run a shell command", "input_schema": BASH_SCHEMA},
            {
                "name": "Read",
                "description": "Read a file",
                "input_schema": READ_SCHEMA,
                "cache_control": {"type": "ephemeral"},
            },
        ],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": False},
    }


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def parse(body: dict[str, Any]) -> NormalizedRequest:
    return PROVIDER.parse_request(body, CTX)


def parse_user(content: Any) -> NormalizedRequest:
    return parse({"model": "m", "max_tokens": 8, "messages": [user(content)]})


# ---------------------------------------------------------------- detection


@pytest.mark.parametrize(
    ("path", "method", "expected"),
    [
        ("/v1/messages", "POST", GENERATE),
        ("/v1/messages/", "POST", GENERATE),
        ("/v1/v1/messages", "POST", GENERATE),
        ("/api/anthropic/v1/messages?beta=true", "POST", GENERATE),
        ("/v1/messages/count_tokens", "POST", COUNT_TOKENS),
        ("/v1/messages/count_tokens", "post", COUNT_TOKENS),
        ("/v1/messages", "GET", None),
        ("/v1/chat/completions", "POST", None),
        ("/v1/responses", "POST", None),
        ("/v1/messages/batches", "POST", None),
    ],
)
def test_operation_matches_path_suffix(path: str, method: str, expected: str | None) -> None:
    assert PROVIDER.operation(RequestContext(path=path, method=method)) == expected


def test_matches_headers_on_anthropic_version() -> None:
    assert PROVIDER.matches_headers({"anthropic-version": "2023-06-01"})
    assert not PROVIDER.matches_headers({"authorization": "Bearer x"})


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (claude_code_body(), True),
        ({"model": "m", "max_tokens": 5, "system": "s", "messages": []}, True),
        ({"max_tokens": 5, "messages": [user("hi")], "stop_sequences": ["x"]}, True),
        (
            {"max_tokens": 5, "messages": [user([{"type": "tool_result", "tool_use_id": "t"}])]},
            True,
        ),
        ({"max_tokens": 5, "messages": [user("hi")]}, False),
        ({"model": "m", "messages": [user("hi")], "system": "s"}, False),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [
                    {"role": "system", "content": "s"},
                    user([{"type": "image_url", "image_url": {"url": "http://x/i.png"}}]),
                ],
            },
            False,
        ),
        ({"contents": [], "max_tokens": 5}, False),
        ([1, 2], False),
        ({"max_tokens": 5, "messages": "hi", "system": "s"}, False),
    ],
)
def test_matches_body(body: Any, expected: bool) -> None:
    assert PROVIDER.matches_body(body) is expected


# ---------------------------------------------------------------- parse


def test_parse_claude_code_request() -> None:
    request = parse(claude_code_body())

    assert request.provider == "anthropic"
    assert request.model == "claude-sonnet-4-5"
    assert request.stream is True
    assert request.messages == [
        {
            "role": "system",
            "content": "You are Claude Code, Anthropic's official CLI for Claude.\n"
            "Use the tools available to you.\nCurrent date: 2026-01-01.",
        },
        user("<system-reminder>\nBe brief.\n</system-reminder>\nList the files."),
        {
            "role": "assistant",
            "content": "Listing.",
            "tool_calls": [call("toolu_01", "Bash", '{"command":"ls","timeout":5}')],
            "reasoning": "I should run ls.",
        },
        {"role": "tool", "tool_call_id": "toolu_01", "content": "a.py\nb.py"},
        user("Now read a.py"),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                call("toolu_02", "Read", '{"file_path":"/w/a.py"}'),
                call("toolu_03", "Read", '{"file_path":"/w/c.py"}'),
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_02", "content": "print(1)"},
        {"role": "tool", "tool_call_id": "toolu_03", "content": "Error: File does not exist."},
    ]
    assert request.tools == [
        {
            "type": "function",
            "function": {
                "name": "Bash",
                "description": "Run a shell command",
                "parameters": BASH_SCHEMA,
            },
        },
        {
            "type": "function",
            "function": {"name": "Read", "description": "Read a file", "parameters": READ_SCHEMA},
        },
    ]
    assert request.dropped_tools == []
    assert request.tool_choice == "auto"
    assert request.params.as_dict() == {"max_tokens": 32000, "temperature": 1.0}
    assert request.requested_model == "claude-sonnet-4-5"
    assert request.capture == CaptureTags(stripped=[BILLING])


def test_billing_header_does_not_break_the_prompt_prefix() -> None:
    first = claude_code_body(BILLING)
    second = claude_code_body(BILLING.replace("cch=4f2e1", "cch=9c0d7"))
    second["messages"] += [
        {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
        user("Thanks"),
    ]

    one, two = parse(first).messages, parse(second).messages

    assert two[: len(one)] == one
    assert two[len(one) :] == [{"role": "assistant", "content": "Done."}, user("Thanks")]
    assert BILLING.partition(":")[0] not in json.dumps(two)


def test_billing_line_removed_from_inside_a_system_string() -> None:
    request = parse(
        {
            "model": "m",
            "max_tokens": 8,
            "system": f"{BILLING}\nYou are helpful.\nBe brief.",
            "messages": [user("hi")],
        }
    )
    assert request.messages[0] == {"role": "system", "content": "You are helpful.\nBe brief."}
    assert request.capture.stripped == [BILLING]


def test_no_system_message_when_only_the_billing_line_was_there() -> None:
    request = parse(
        {
            "model": "m",
            "max_tokens": 8,
            "system": [{"type": "text", "text": BILLING}],
            "messages": [user("hi")],
        }
    )
    assert request.messages == [user("hi")]


def test_user_media_and_documents() -> None:
    request = parse_user(
        [
            {"type": "text", "text": "Look:"},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"},
            },
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
            {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "doc text"},
            },
            {
                "type": "document",
                "source": {"type": "content", "content": [{"type": "text", "text": "chunk"}]},
            },
            {
                "type": "search_result",
                "source": "https://example.com",
                "title": "t",
                "content": [{"type": "text", "text": "found it"}],
            },
        ]
    )
    assert request.messages == [
        user(
            [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
                {"type": "text", "text": "doc text"},
                {"type": "text", "text": "chunk"},
                {"type": "text", "text": "found it"},
            ]
        )
    ]
    assert request.capture.notes == []
    assert request.capture.features == {"text documents": "mapped"}
    with pytest.raises(InvalidRequest, match="Files API"):
        parse_user([{"type": "image", "source": {"type": "file", "file_id": "file_1"}}])


def test_a_titled_text_document_keeps_its_title() -> None:
    document = {
        "type": "document",
        "title": "notes.txt",
        "source": {"type": "text", "media_type": "text/plain", "data": "doc text"},
    }
    assert parse_user([document]).messages == [user("notes.txt\n\ndoc text")]


@pytest.mark.parametrize(
    "source",
    [
        {"type": "base64", "media_type": "application/pdf", "data": "JVBE"},
        {"type": "url", "url": "https://example.com/a.pdf"},
    ],
)
def test_pdf_documents_are_refused_by_name(source) -> None:
    with pytest.raises(InvalidRequest, match="PDF documents"):
        parse_user([{"type": "document", "source": source}])


def test_tool_result_images_move_to_the_following_user_message() -> None:
    request = parse_user(
        [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [
                    {"type": "text", "text": "Screenshot taken"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AAA"},
                    },
                ],
            },
            {"type": "text", "text": "What do you see?"},
        ]
    )
    assert request.messages == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Screenshot taken"},
        user(
            [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}},
                {"type": "text", "text": "What do you see?"},
            ]
        ),
    ]


@pytest.mark.parametrize(
    ("result", "content"),
    [
        ({"tool_use_id": "t"}, ""),
        ({"tool_use_id": "t", "content": []}, ""),
        ({"tool_use_id": "t", "content": "", "is_error": True}, "Error"),
        ({"tool_use_id": "t", "content": "boom", "is_error": True}, "Error: boom"),
        ({"tool_use_id": "t", "content": "fine", "is_error": False}, "fine"),
        (
            {
                "tool_use_id": "t",
                "content": [
                    {"type": "text", "text": "x"},
                    {
                        "type": "document",
                        "source": {"type": "text", "media_type": "text/plain", "data": "y"},
                    },
                ],
            },
            "x\ny",
        ),
    ],
)
def test_tool_result_content(result: dict[str, Any], content: str) -> None:
    request = parse_user([{"type": "tool_result", **result}])
    assert request.messages == [{"role": "tool", "tool_call_id": "t", "content": content}]


def test_assistant_thinking_variants() -> None:
    request = parse(
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [
                user("hi"),
                {
                    "role": "assistant",
                    "content": [
                        {"type": "redacted_thinking", "data": "EmwKAhgBEgy..."},
                        {
                            "type": "thinking",
                            "thinking": "foreign thought",
                            "signature": "ErUBCkYIBRgC",
                        },
                        {
                            "type": "server_tool_use",
                            "id": "srvtoolu_1",
                            "name": "web_search",
                            "input": {},
                        },
                        {"type": "text", "text": "Hello"},
                    ],
                },
                user("again"),
                {
                    "role": "assistant",
                    "content": [
                        # Our own signature wins over a thinking text the client may have altered.
                        {
                            "type": "thinking",
                            "thinking": "",
                            "signature": encode_reasoning("exact ✓"),
                        },
                        {"type": "text", "text": ""},
                    ],
                },
            ],
        }
    )
    assert request.messages == [
        user("hi"),
        {"role": "assistant", "content": "Hello", "reasoning": "foreign thought"},
        user("again"),
        {"role": "assistant", "content": "", "reasoning": "exact ✓"},
    ]
    assert request.capture.notes == [
        "dropped redacted_thinking block at messages[1].content[0]",
        "dropped server_tool_use block at messages[1].content[2]",
    ]


def test_string_and_empty_contents() -> None:
    request = parse(
        {
            "model": "m",
            "max_tokens": 8,
            "system": "sys",
            "messages": [user(""), {"role": "assistant", "content": "plain"}, user([])],
        }
    )
    assert request.messages == [
        {"role": "system", "content": "sys"},
        user(""),
        {"role": "assistant", "content": "plain"},
        user(""),
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any", "disable_parallel_tool_use": True}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "Bash"}, {"type": "function", "function": {"name": "Bash"}}),
        (None, None),
    ],
)
def test_tool_choice(choice: Any, expected: Any) -> None:
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [user("hi")],
        "tools": [{"name": "Bash", "input_schema": BASH_SCHEMA}],
        "tool_choice": choice,
    }
    request = parse(body)
    assert request.tool_choice == expected
    assert request.chat_body().get("tool_choice") == expected


def test_tool_choice_dropped_without_tools_and_schema_defaults() -> None:
    no_tools = parse(
        {"model": "m", "max_tokens": 8, "messages": [user("hi")], "tool_choice": {"type": "any"}}
    )
    assert no_tools.tools == []
    assert no_tools.tool_choice is None

    custom = parse(
        {"model": "m", "messages": [user("hi")], "tools": [{"type": "custom", "name": "noop"}]}
    )
    assert custom.tools == [
        {
            "type": "function",
            "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}},
        }
    ]


def test_sampling_params_and_missing_max_tokens() -> None:
    request = parse(
        {
            "model": "m",
            "messages": [user("hi")],
            "temperature": 0.2,
            "top_p": 0.9,
            "top_k": 40,
            "stop_sequences": ["</done>", "\n\nHuman:"],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        }
    )
    assert request.params.as_dict() == {
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "stop": ["</done>", "\n\nHuman:"],
    }
    assert request.stream is False
    assert request.requested_model == "m"
    # The thinking budget is no sampling parameter: it is on the record, by name.
    assert request.capture.features == {"thinking.budget_tokens": "mapped"}


MALFORMED: list[Any] = [
    [],
    "hello",
    {},
    {"messages": None},
    {"messages": "hi"},
    {"messages": [1]},
    {"messages": [{"role": "bot", "content": "x"}]},
    {"messages": [{"role": "user"}]},
    {"messages": [{"role": "user", "content": 5}]},
    {"messages": [user([{"text": "no type"}])]},
    {"messages": [user(["text"])]},
    {"messages": [user([{"type": "text", "text": 3}])]},
    {"messages": [user([{"type": "image", "source": {"type": "base64", "data": "x"}}])]},
    {"messages": [user([{"type": "image"}])]},
    {"messages": [user([{"type": "document", "source": "x"}])]},
    {"messages": [user([{"type": "tool_result", "content": "x"}])]},
    {"messages": [user([{"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}])]},
    {"messages": [user([{"type": "tool_result", "tool_use_id": "t", "content": 7}])]},
    {
        "messages": [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "a", "input": [1]}],
            }
        ]
    },
    {
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {}}]}
        ]
    },
    {
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "name": "a", "input": {}}]}
        ]
    },
    {"messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": 1}]}]},
    {"messages": [{"role": "system", "content": [{"type": "image", "source": {}}]}]},
    # Python's json decodes integers of any size; orjson cannot re-encode them as arguments.
    {
        "messages": [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "a", "input": {"n": 2**70}}],
            }
        ]
    },
    {"messages": [], "system": 5},
    {"messages": [], "model": 5},
    {"messages": [], "stream": "yes"},
    {"messages": [], "tools": "x"},
    {"messages": [], "tools": [{"description": "no name"}]},
    {"messages": [], "tools": [{"name": "a", "input_schema": "x"}]},
    {"messages": [], "tools": [{"name": "a", "description": 1}]},
    {"messages": [], "tools": [{"type": 3}]},
    {"messages": [], "tool_choice": {"type": "sometimes"}},
    {"messages": [], "tool_choice": {"type": "tool"}},
    {"messages": [], "tool_choice": "auto"},
    {"messages": [], "thinking": "on"},
    {"messages": [], "thinking": {}},
    {"messages": [], "max_tokens": "10"},
    {"messages": [], "max_tokens": 1.5},
    {"messages": [], "temperature": "hot"},
    {"messages": [], "top_k": True},
    {"messages": [], "stop_sequences": [1]},
]


@pytest.mark.parametrize("body", MALFORMED)
def test_malformed_requests_raise_invalid_request(body: Any) -> None:
    with pytest.raises(InvalidRequest):
        parse(body)


# ---------------------------------------------------------------- the SDK round trip

REASONING = "The user wants a listing.\nRun ls -la."
TOOL_COMPLETION = Completion(
    id="chatcmpl-7",
    model="engine/smollm2",
    content="Let me look.",
    reasoning=REASONING,
    tool_calls=[
        ToolCall(id="call_abc", name="Bash", arguments='{"command": "ls -la", "timeout": 5}')
    ],
    finish_reason="tool_calls",
    prompt_tokens=120,
    completion_tokens=31,
)
TOOL_BLOCKS = [
    {"type": "thinking", "thinking": REASONING, "signature": encode_reasoning(REASONING)},
    {"type": "text", "text": "Let me look."},
    {
        "type": "tool_use",
        "id": "call_abc",
        "name": "Bash",
        "input": {"command": "ls -la", "timeout": 5},
    },
]
USAGE = {
    "input_tokens": 120,
    "output_tokens": 31,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
}


class FakeGateway:
    """A MockTransport handler doing what the gateway does with this adapter."""

    def __init__(self, completion: Completion | None = None, error: GatewayError | None = None):
        self.completion = completion
        self.error = error
        self.requests: list[NormalizedRequest] = []
        self.operations: list[str | None] = []

    def __call__(self, http: httpx2.Request) -> httpx2.Response:
        ctx = RequestContext(
            path=http.url.path,
            method=http.method,
            query=dict(http.url.params),
            headers={k.lower(): v for k, v in http.headers.items()},
        )
        operation = PROVIDER.operation(ctx)
        self.operations.append(operation)
        try:
            request = PROVIDER.parse_request(orjson.loads(http.content), ctx)
        except GatewayError as err:
            return httpx2.Response(err.status, json=PROVIDER.error_body(err))
        self.requests.append(request)
        if operation == COUNT_TOKENS:
            return httpx2.Response(200, json=PROVIDER.render_token_count(42))
        if self.error is not None:
            return httpx2.Response(self.error.status, json=PROVIDER.error_body(self.error))
        assert self.completion is not None
        if request.stream:
            frames = PROVIDER.render_stream(self.completion, request)
            return httpx2.Response(
                200, headers={"content-type": "text/event-stream"}, content=b"".join(frames)
            )
        return httpx2.Response(200, json=PROVIDER.render_response(self.completion, request))


def sdk_client(gateway: FakeGateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="session-key",
        base_url="http://gateway.test/s/session-key",
        http_client=httpx2.Client(transport=httpx2.MockTransport(gateway)),
        max_retries=0,
    )


def ask(**overrides: Any) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "messages": [{"role": "user", "content": "List the files."}],
        "tools": [{"name": "Bash", "description": "Run a command", "input_schema": BASH_SCHEMA}],
        "thinking": {"type": "adaptive"},
        **overrides,
    }


def test_sdk_non_stream_message() -> None:
    gateway = FakeGateway(TOOL_COMPLETION)
    message = sdk_client(gateway).messages.create(**ask())

    assert gateway.operations == [GENERATE]
    assert message.id == "msg_chatcmpl-7"
    assert message.model == "claude-sonnet-4-5"
    assert [block.to_dict() for block in message.content] == TOOL_BLOCKS
    assert message.stop_reason == "tool_use"
    assert message.stop_sequence is None
    assert message.usage.to_dict() == USAGE


def test_sdk_stream_accumulates_to_the_rendered_message() -> None:
    gateway = FakeGateway(TOOL_COMPLETION)
    client = sdk_client(gateway)
    with client.messages.stream(**ask()) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()

    assert gateway.requests[0].stream is True
    assert texts == ["Let me look."]
    assert [block.to_dict() for block in final.content] == TOOL_BLOCKS
    accumulated = final.to_dict()
    assert accumulated.pop("stop_details") is None  # the SDK's own field, set from message_delta
    assert accumulated == PROVIDER.render_response(TOOL_COMPLETION, gateway.requests[0])


def test_stream_event_grammar() -> None:
    gateway = FakeGateway(TOOL_COMPLETION)
    events = list(sdk_client(gateway).messages.create(**ask(), stream=True))

    grammar = [
        (e.type, getattr(e, "index", None), getattr(getattr(e, "delta", None), "type", None))
        for e in events
    ]
    assert grammar == [
        ("message_start", None, None),
        ("content_block_start", 0, None),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, None),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, None),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert events[0].message.content == []
    assert events[0].message.stop_reason is None
    assert events[0].message.usage.input_tokens == 120
    assert json.loads(events[9].delta.partial_json) == {"command": "ls -la", "timeout": 5}
    assert events[11].delta.stop_reason == "tool_use"
    assert events[11].usage.output_tokens == 31


def test_raw_frames_carry_named_events() -> None:
    frames = PROVIDER.render_stream(TOOL_COMPLETION, parse_user("hi"))
    for frame in frames:
        event_line, data_line, *rest = frame.decode().split("\n")
        assert rest == ["", ""]
        name = event_line.removeprefix("event: ")
        assert json.loads(data_line.removeprefix("data: "))["type"] == name
    assert frames[1] == b'event: ping\ndata: {"type":"ping"}\n\n'


def test_tool_call_round_trip_recovers_history() -> None:
    gateway = FakeGateway(TOOL_COMPLETION)
    client = sdk_client(gateway)
    with client.messages.stream(**ask()) as stream:
        final = stream.get_final_message()
    tool_use = final.content[2]
    assert tool_use.type == "tool_use"

    gateway.completion = Completion(
        id="msg_2", model="m", content="Two files.", finish_reason="stop"
    )
    reply = client.messages.create(
        **ask(
            messages=[
                {"role": "user", "content": "List the files."},
                final.to_param(),
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": tool_use.id,
                            "content": [{"type": "text", "text": "a.txt\nb.txt"}],
                        }
                    ],
                },
            ],
        )
    )

    history = gateway.requests[1].messages
    assert history == [
        user("List the files."),
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [call("call_abc", "Bash", '{"command":"ls -la","timeout":5}')],
            "reasoning": REASONING,
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": "a.txt\nb.txt"},
    ]
    sent = json.loads(TOOL_COMPLETION.tool_calls[0].arguments)
    assert json.loads(history[1]["tool_calls"][0]["function"]["arguments"]) == sent
    assert reply.id == "msg_2"
    assert [block.to_dict() for block in reply.content] == [{"type": "text", "text": "Two files."}]
    assert reply.stop_reason == "end_turn"


@pytest.mark.parametrize(
    ("finish", "tool_calls", "stop_reason"),
    [
        ("stop", [], "end_turn"),
        ("length", [], "max_tokens"),
        ("content_filter", [], "refusal"),
        ("tool_calls", [ToolCall(id="c1", name="f", arguments="{}")], "tool_use"),
        ("stop", [ToolCall(id="c1", name="f", arguments="{}")], "tool_use"),
        ("tool_calls", [], "end_turn"),
        ("length", [ToolCall(id="c1", name="f", arguments="{}")], "max_tokens"),
    ],
)
def test_stop_reasons(finish: str, tool_calls: list[ToolCall], stop_reason: str) -> None:
    completion = Completion(
        id="x", model="m", content="hi", tool_calls=tool_calls, finish_reason=finish
    )
    gateway = FakeGateway(completion)
    client = sdk_client(gateway)
    assert client.messages.create(**ask()).stop_reason == stop_reason
    with client.messages.stream(**ask()) as stream:
        assert stream.get_final_message().stop_reason == stop_reason


def test_empty_completion_is_one_empty_text_block() -> None:
    gateway = FakeGateway(Completion(id="", model="m", finish_reason="length", completion_tokens=0))
    client = sdk_client(gateway)

    message = client.messages.create(**ask())
    with client.messages.stream(**ask()) as stream:
        streamed = stream.get_final_message()

    for final in (message, streamed):
        assert [block.to_dict() for block in final.content] == [{"type": "text", "text": ""}]
        assert final.id.startswith("msg_")
        assert final.stop_reason == "max_tokens"


def test_reasoning_only_and_ids_for_unnamed_calls() -> None:
    thought_only = PROVIDER.render_response(
        Completion(id="msg_9", model="m", reasoning="hmm"), parse_user("hi")
    )
    assert thought_only["id"] == "msg_9"
    assert [block["type"] for block in thought_only["content"]] == ["thinking"]

    unnamed = Completion(
        id="x",
        model="m",
        tool_calls=[
            ToolCall(id="", name="f", arguments="not json"),
            ToolCall(id="", name="g", arguments="[1]"),
        ],
        finish_reason="tool_calls",
    )
    blocks = PROVIDER.render_response(unnamed, parse_user("hi"))["content"]
    assert [b["type"] for b in blocks] == ["tool_use", "tool_use"]
    assert all(b["id"].startswith("toolu_") for b in blocks)
    assert blocks[0]["id"] != blocks[1]["id"]
    assert [b["input"] for b in blocks] == [{}, {}]


def test_reply_echoes_the_requested_model_not_the_policy_model() -> None:
    request = parse_user("hi")
    request.model = "pinned-engine-model"
    reply = PROVIDER.render_response(Completion(id="x", model="engine"), request)
    assert reply["model"] == "m"


def test_sdk_count_tokens() -> None:
    gateway = FakeGateway()
    count = sdk_client(gateway).messages.count_tokens(
        model="claude-sonnet-4-5",
        system="be brief",
        messages=[{"role": "user", "content": "hello"}],
    )
    assert gateway.operations == [COUNT_TOKENS]
    assert gateway.requests[0].messages == [
        {"role": "system", "content": "be brief"},
        user("hello"),
    ]
    assert count.input_tokens == 42


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("error", "exception", "error_type"),
    [
        (InvalidRequest("bad field x"), anthropic.BadRequestError, "invalid_request_error"),
        (
            AuthenticationFailed("unknown session"),
            anthropic.AuthenticationError,
            "authentication_error",
        ),
        (NotFound("no such thing"), anthropic.NotFoundError, "not_found_error"),
        (PayloadTooLarge("body over 32 MB"), anthropic.ContentTooLargeError, "request_too_large"),
        (RateLimited("queue full", retry_after=2), anthropic.RateLimitError, "rate_limit_error"),
        (EngineError("engine said 500"), anthropic.InternalServerError, "api_error"),
        (EngineRejected("context too long"), anthropic.BadRequestError, "invalid_request_error"),
        (EngineUnavailable("engine paused"), anthropic.ServiceUnavailableError, "overloaded_error"),
        (EngineTimeout("engine slow"), anthropic.InternalServerError, "timeout_error"),
        (GatewayError("unexpected"), anthropic.InternalServerError, "api_error"),
    ],
)
def test_sdk_raises_its_own_error_classes(
    error: GatewayError, exception: type[anthropic.APIStatusError], error_type: str
) -> None:
    client = sdk_client(FakeGateway(error=error))
    with pytest.raises(exception) as caught:
        client.messages.create(**ask())
    assert caught.value.status_code == error.status
    assert caught.value.body == {
        "type": "error",
        "error": {"type": error_type, "message": error.message},
    }
    assert error.message in str(caught.value)


def test_sdk_sees_parse_errors_as_bad_request() -> None:
    client = sdk_client(FakeGateway(TOOL_COMPLETION))
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(**ask(tool_choice={"type": "sometimes"}))
    assert "tool_choice.type" in str(caught.value)


def test_parse_does_not_mutate_the_body() -> None:
    body = claude_code_body()
    before = copy.deepcopy(body)
    parse(body)
    assert body == before


def test_an_empty_message_list_is_refused_before_any_engine_sees_it() -> None:
    with pytest.raises(InvalidRequest, match="at least one message"):
        PROVIDER.parse_request({"model": "m", "max_tokens": 8, "messages": []}, CTX)


@pytest.mark.parametrize(
    ("kind", "name", "commands"),
    [
        (
            "text_editor_20250124",
            "str_replace_editor",
            ["view", "create", "str_replace", "insert", "undo_edit"],
        ),
        (
            "text_editor_20250429",
            "str_replace_based_edit_tool",
            ["view", "create", "str_replace", "insert"],
        ),
        (
            "text_editor_20250728",
            "str_replace_based_edit_tool",
            ["view", "create", "str_replace", "insert"],
        ),
    ],
)
def test_text_editor_schema_tools_become_function_tools(kind, name, commands) -> None:
    request = parse(
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [user("hi")],
            "tools": [{"type": kind, "name": name}],
        }
    )
    (tool,) = request.tools
    assert tool["function"]["name"] == name
    schema = tool["function"]["parameters"]
    assert schema["properties"]["command"]["enum"] == commands
    assert set(schema["properties"]) == {
        "command",
        "path",
        "file_text",
        "old_str",
        "new_str",
        "insert_line",
        "view_range",
    }
    assert request.dropped_tools == []
    assert request.capture.features == {f"tool {kind}": "mapped"}


def test_bash_schema_tool_becomes_a_function_tool() -> None:
    request = parse(
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [user("hi")],
            "tools": [{"type": "bash_20250124", "name": "bash"}],
            "tool_choice": {"type": "any"},
        }
    )
    assert request.tools == [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "string"}, "restart": {"type": "boolean"}},
                },
            },
        }
    ]
    assert request.tool_choice == "required"
    assert "feature tool bash_20250124: mapped" in request.capture.record_notes()


@pytest.mark.parametrize("kind", ["web_search_20250305", "code_execution_20250522", "mcp"])
def test_server_tools_are_refused_naming_the_tool(kind) -> None:
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [user("hi")],
        "tools": [{"type": kind, "name": "x"}],
    }
    with pytest.raises(InvalidRequest, match=kind):
        parse(body)


def test_assistant_prefill_is_continued() -> None:
    request = parse(
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [user("Give JSON"), {"role": "assistant", "content": '{"a":'}],
        }
    )
    assert request.messages[-1] == {"role": "assistant", "content": '{"a":'}
    assert request.continue_final
    body = request.chat_body()
    assert body["continue_final_message"] is True
    assert body["add_generation_prompt"] is False
    assert request.capture.features == {"assistant prefill": "honoured"}


@pytest.mark.parametrize(
    ("last", "message"),
    [
        ({"role": "assistant", "content": "Sure "}, "trailing whitespace"),
        (
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
            },
            "prefill",
        ),
    ],
)
def test_assistant_prefill_rules(last, message) -> None:
    with pytest.raises(InvalidRequest, match=message):
        parse({"model": "m", "max_tokens": 8, "messages": [user("hi"), last]})


def test_disable_parallel_tool_use_is_forwarded() -> None:
    tool = {"name": "f", "input_schema": {"type": "object"}}
    request = parse(
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [user("hi")],
            "tools": [tool],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        }
    )
    assert request.chat_body()["parallel_tool_calls"] is False
    assert request.capture.features == {"disable_parallel_tool_use": "mapped"}
