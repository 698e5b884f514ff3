"""The OpenAI Responses adapter, checked against the official ``openai`` SDK's own parsers."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import orjson
import pytest

from polar.errors import (
    AuthenticationFailed,
    EngineUnavailable,
    GatewayError,
    InvalidRequest,
    NotFound,
    RateLimited,
)
from polar.providers.base import COUNT_TOKENS, GENERATE, RequestContext
from polar.providers.openai_responses import COMPACT, OpenAIResponsesProvider
from polar.providers.reasoning_codec import decode_reasoning, encode_reasoning
from polar.providers.stateful import RETRIEVE
from polar.providers.types import Completion, NormalizedRequest, ToolCall

CTX = RequestContext(path="/v1/responses")
PROVIDER = OpenAIResponsesProvider()

INSTRUCTIONS = "You are Codex, a coding agent running in a terminal."
PERMISSIONS = (
    "<permissions instructions>sandbox_mode is danger-full-access</permissions instructions>"
)
ENVIRONMENT = "<environment_context>\n  <cwd>/work</cwd>\n</environment_context>"
PATCH = "*** Begin Patch\n*** Add File: a.py\n+print(1)\n*** End Patch"

SHELL_TOOL = {
    "type": "function",
    "name": "shell",
    "description": "Runs a shell command and returns its output.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        "required": ["command"],
        "additionalProperties": False,
    },
}
APPLY_PATCH_TOOL = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch"'},
}


def codex_request() -> dict[str, Any]:
    """A multi-turn request shaped like Codex CLI's (0.169): three sampled turns replayed."""
    return {
        "model": "gpt-5-codex",
        "instructions": INSTRUCTIONS,
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": PERMISSIONS}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": ENVIRONMENT}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Fix the test."}],
            },
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "**Running tests**"}],
                "content": None,
                "encrypted_content": encode_reasoning("I should run the tests first."),
            },
            {
                "type": "function_call",
                "name": "shell",
                "arguments": '{"command":["pytest","-q"]}',
                "call_id": "call_A",
            },
            {"type": "function_call_output", "call_id": "call_A", "output": "1 failed"},
            {
                "type": "reasoning",
                "summary": [],
                "encrypted_content": encode_reasoning("Add the file, then rerun."),
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Adding a.py."}],
            },
            {
                "type": "custom_tool_call",
                "call_id": "call_B",
                "name": "apply_patch",
                "input": PATCH,
            },
            {
                "type": "function_call",
                "name": "shell",
                "arguments": '{"command":["pytest"]}',
                "call_id": "call_C",
            },
            {"type": "custom_tool_call_output", "call_id": "call_B", "output": "Done!"},
            {
                "type": "function_call_output",
                "call_id": "call_C",
                "output": [{"type": "input_text", "text": "1 passed"}],
            },
            {
                "type": "local_shell_call",
                "id": "lsh_1",
                "call_id": "call_D",
                "status": "completed",
                "action": {
                    "type": "exec",
                    "command": ["ls"],
                    "env": {},
                    "working_directory": "/work",
                    "timeout_ms": 1000,
                },
            },
            {"type": "function_call_output", "call_id": "call_D", "output": "a.py"},
        ],
        "tools": [SHELL_TOOL, APPLY_PATCH_TOOL, {"type": "local_shell"}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199-session",
        "text": {"verbosity": "low"},
    }


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


CODEX_MESSAGES = [
    {"role": "system", "content": INSTRUCTIONS + "\n\n" + PERMISSIONS},
    {"role": "user", "content": ENVIRONMENT},
    {"role": "user", "content": "Fix the test."},
    {
        "role": "assistant",
        "content": "",
        "reasoning": "I should run the tests first.",
        "tool_calls": [call("call_A", "shell", '{"command":["pytest","-q"]}')],
    },
    {"role": "tool", "tool_call_id": "call_A", "content": "1 failed"},
    {
        "role": "assistant",
        "content": "Adding a.py.",
        "reasoning": "Add the file, then rerun.",
        "tool_calls": [
            call("call_B", "apply_patch", json.dumps({"input": PATCH}, separators=(",", ":"))),
            call("call_C", "shell", '{"command":["pytest"]}'),
        ],
    },
    {"role": "tool", "tool_call_id": "call_B", "content": "Done!"},
    {"role": "tool", "tool_call_id": "call_C", "content": "1 passed"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            call("call_D", "local_shell", '{"command":["ls"],"workdir":"/work","timeout_ms":1000}')
        ],
    },
    {"role": "tool", "tool_call_id": "call_D", "content": "a.py"},
]


def parse(body: Any) -> NormalizedRequest:
    return PROVIDER.parse_request(body, CTX)


# --------------------------------------------------------------------------- detection


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/v1/responses", GENERATE),
        ("POST", "/responses", GENERATE),
        ("POST", "/api/v1/v1/responses/", GENERATE),
        ("POST", "/v1/responses/input_tokens", COUNT_TOKENS),
        ("POST", "/v1/responses/compact", COMPACT),
        ("GET", "/v1/responses", None),
        ("POST", "/v1/responses/resp_1/cancel", None),
        ("POST", "/v1/chat/completions", None),
        ("POST", "/v1/messages", None),
    ],
)
def test_operation_matches_path_suffix(method: str, path: str, expected: str | None) -> None:
    assert PROVIDER.operation(RequestContext(path=path, method=method)) == expected


def test_matches_body_on_input_without_messages() -> None:
    assert PROVIDER.matches_body({"model": "m", "input": "hi"})
    assert PROVIDER.matches_body({"input": []})
    assert not PROVIDER.matches_body({"input": "hi", "messages": []})
    assert not PROVIDER.matches_body({"messages": [{"role": "user", "content": "hi"}]})
    assert not PROVIDER.matches_body({"input": 3})
    assert not PROVIDER.matches_body(["input"])


# --------------------------------------------------------------------------- parse


def test_codex_request_normalizes_exactly() -> None:
    request = parse(codex_request())
    assert request.provider == "openai_responses"
    assert request.model == "gpt-5-codex"
    assert request.stream is True
    assert request.messages == CODEX_MESSAGES
    assert request.dropped_tools == []
    assert request.tool_choice == "auto"
    assert [t["function"]["name"] for t in request.tools] == ["shell", "apply_patch", "local_shell"]
    assert request.tools[0] == {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Runs a shell command and returns its output.",
            "parameters": SHELL_TOOL["parameters"],
        },
    }
    patch_params = request.tools[1]["function"]["parameters"]
    assert patch_params["required"] == ["input"]
    assert patch_params["properties"]["input"]["type"] == "string"
    assert 'start: "*** Begin Patch"' in patch_params["properties"]["input"]["description"]
    shell_params = request.tools[2]["function"]["parameters"]
    assert shell_params["required"] == ["command"]
    assert set(shell_params["properties"]) == {"command", "workdir", "timeout_ms"}
    assert request.params.as_dict() == {}
    assert request.adapter_state.custom_tools == ["apply_patch"]
    assert request.adapter_state.local_shell is True
    assert request.capture.notes == []


def test_reasoning_attaches_to_the_turn_that_follows_it() -> None:
    """The known chain-breaker: reasoning, text and calls of one turn fold into one message."""
    items = [
        {"role": "user", "content": "go"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think 1"}]},
        {"type": "message", "role": "assistant", "content": "first"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think 2"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": '{"a":1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "r1"},
        {"type": "function_call_output", "call_id": "c2", "output": "r2"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think 3"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "end"}],
        },
    ]
    assert parse({"model": "m", "input": items}).messages == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "first", "reasoning": "think 1"},
        {
            "role": "assistant",
            "content": "",
            "reasoning": "think 2",
            "tool_calls": [call("c1", "f", "{}"), call("c2", "g", '{"a":1}')],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
        {"role": "assistant", "content": "end", "reasoning": "think 3"},
    ]


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (  # a second text message is a second turn
            [
                {"role": "assistant", "content": "a"},
                {"role": "assistant", "content": "b"},
            ],
            [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}],
        ),
        (  # text after a call belongs to the next turn
            [
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"role": "assistant", "content": "b"},
            ],
            [
                {"role": "assistant", "content": "", "tool_calls": [call("c", "f", "{}")]},
                {"role": "assistant", "content": "b"},
            ],
        ),
        (  # redacted reasoning keeps no text but still opens a new turn
            [
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA-foreign"},
                {"type": "function_call", "call_id": "d", "name": "f", "arguments": "{}"},
            ],
            [
                {"role": "assistant", "content": "", "tool_calls": [call("c", "f", "{}")]},
                {"role": "assistant", "content": "", "tool_calls": [call("d", "f", "{}")]},
            ],
        ),
        (  # reasoning alone (a turn cut by its length limit) stays an assistant turn
            [
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
                {"role": "user", "content": "continue"},
            ],
            [
                {"role": "assistant", "content": "", "reasoning": "hm"},
                {"role": "user", "content": "continue"},
            ],
        ),
    ],
)
def test_turn_boundaries(items: list[Any], expected: list[Any]) -> None:
    assert parse({"input": items}).messages == expected


def test_reasoning_text_sources_in_order_of_fidelity() -> None:
    def reasoning_of(item: dict[str, Any]) -> str | None:
        messages = parse({"input": [{"type": "reasoning", **item}]}).messages
        return messages[0].get("reasoning") if messages else None

    summary = [{"type": "summary_text", "text": "s1"}, {"type": "summary_text", "text": "s2"}]
    raw = [{"type": "reasoning_text", "text": "raw"}]
    ours = encode_reasoning("exact\n text ✓")
    assert reasoning_of({"summary": summary, "content": raw, "encrypted_content": ours}) == (
        "exact\n text ✓"
    )
    assert reasoning_of({"summary": summary, "content": raw, "encrypted_content": "foreign"}) == (
        "raw"
    )
    assert reasoning_of({"summary": summary, "encrypted_content": "foreign"}) == "s1\ns2"
    assert reasoning_of({"summary": [], "encrypted_content": "foreign"}) is None


def test_string_input_and_untyped_items() -> None:
    request = parse({"model": "m", "input": "hello", "instructions": "be brief"})
    assert request.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
    ]
    request = parse(
        {"input": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]}
    )
    assert request.messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
    ]


def test_images_and_files_become_chat_parts() -> None:
    request = parse(
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "what is this?"},
                        {
                            "type": "input_image",
                            "image_url": "data:image/png;base64,AAAA",
                            "detail": "low",
                        },
                        {
                            "type": "input_file",
                            "file_data": "data:application/pdf;base64,AA",
                            "filename": "a.pdf",
                        },
                    ],
                }
            ]
        }
    )
    assert request.messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"},
                },
                {
                    "type": "file",
                    "file": {"file_data": "data:application/pdf;base64,AA", "filename": "a.pdf"},
                },
            ],
        }
    ]


def test_tool_output_images_follow_the_tool_results_as_a_user_turn() -> None:
    image = {"type": "input_image", "image_url": "https://example.com/a.png"}
    items = [
        {"type": "function_call", "call_id": "c1", "name": "view_image", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_text", "text": "ok"}, image],
        },
        {"type": "function_call_output", "call_id": "c2", "output": "done"},
        {"role": "user", "content": "next"},
    ]
    assert parse({"input": items}).messages[1:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "tool", "tool_call_id": "c2", "content": "done"},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}],
        },
        {"role": "user", "content": "next"},
    ]


def test_local_shell_output_by_item_id_and_ignored_items() -> None:
    items = [
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {
            "type": "local_shell_call",
            "id": "ls_1",
            "call_id": "ls_1",
            "status": "completed",
            "action": {"type": "exec", "command": ["pwd"], "env": {}},
        },
        {"type": "local_shell_call_output", "id": "ls_1", "output": "/work"},
    ]
    request = parse({"input": items, "tools": [{"type": "local_shell"}]})
    assert request.messages == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("ls_1", "local_shell", '{"command":["pwd"]}')],
        },
        {"role": "tool", "tool_call_id": "ls_1", "content": "/work"},
    ]
    assert request.capture.ignored_items == ["web_search_call"]


def test_previous_response_id_is_left_to_the_gateway_to_resolve() -> None:
    request = parse({"input": "more", "previous_response_id": "resp_123"})
    assert request.adapter_state.echo["previous_response_id"] == "resp_123"
    assert PROVIDER.continues(request) == "resp_123"
    assert request.capture.features["previous_response_id"] == "honoured"
    assert request.messages == [{"role": "user", "content": "more"}]


def test_continuation_puts_the_stored_context_first_and_drops_old_instructions() -> None:
    request = parse(
        {
            "input": [
                {"role": "developer", "content": "Be brief."},
                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
            ],
            "instructions": "New rules.",
            "previous_response_id": "resp_1",
        }
    )
    context = [
        {"role": "system", "content": "Old rules.\n\nUse tools."},
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "shell", "{}")]},
    ]
    PROVIDER.continue_after(request, context, {"instructions": "Old rules."})
    assert request.messages == [
        {"role": "system", "content": "New rules.\n\nUse tools.\n\nBe brief."},
        *context[1:],
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]


def test_same_instructions_keep_the_continued_prompt_a_prefix_extension() -> None:
    request = parse({"input": "more", "instructions": "Rules.", "previous_response_id": "r"})
    context = [{"role": "system", "content": "Rules."}, {"role": "user", "content": "hi"}]
    stored = {"instructions": "Rules."}
    PROVIDER.continue_after(request, [*context, {"role": "assistant", "content": "yo"}], stored)
    assert request.messages[:2] == context


def test_stored_replies_and_their_paths() -> None:
    request = parse({"input": "x"})
    completion = Completion(id="chatcmpl-1", model="m", content="ok")
    kept = PROVIDER.reply_to_store(completion, request)
    assert kept is not None and kept[0] == "resp_chatcmpl-1" and kept[1]["store"] is True
    assert PROVIDER.reply_to_store(completion, parse({"input": "x", "store": False})) is None
    get = RequestContext(path="/v1/responses/resp_chatcmpl-1", method="GET")
    assert PROVIDER.operation(get) == RETRIEVE
    assert PROVIDER.reply_id(get) == "resp_chatcmpl-1"
    assert PROVIDER.operation(RequestContext(path="/v1/responses/x", method="DELETE")) == RETRIEVE
    assert PROVIDER.operation(RequestContext(path="/v1/responses", method="GET")) is None
    assert PROVIDER.not_found("r", continued=True).status == 400
    assert PROVIDER.not_found("r", continued=False).status == 404


def test_conversation_is_refused_by_name() -> None:
    with pytest.raises(InvalidRequest, match="conversation is not supported"):
        parse({"input": "x", "conversation": "conv_1"})


def test_sampling_params_and_accepted_fields() -> None:
    request = parse(
        {
            "model": "m",
            "input": "x",
            "max_output_tokens": 128,
            "temperature": 0.5,
            "top_p": 1,
            "top_k": 20,
            "stop": ["ignored"],
            "service_tier": "auto",
            "truncation": "auto",
            "user": "u",
            "metadata": {"k": "v"},
            "background": False,
        }
    )
    assert request.params.as_dict() == {
        "max_tokens": 128,
        "temperature": 0.5,
        "top_p": 1.0,
        "top_k": 20,
    }
    assert request.stream is False
    assert request.tools == [] and request.tool_choice is None


@pytest.mark.parametrize(
    ("tool_choice", "expected"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        (
            {"type": "function", "name": "shell"},
            {"type": "function", "function": {"name": "shell"}},
        ),
        (
            {"type": "custom", "name": "apply_patch"},
            {"type": "function", "function": {"name": "apply_patch"}},
        ),
        ({"type": "allowed_tools", "mode": "required", "tools": []}, "required"),
        (
            {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "shell"}],
            },
            {"type": "function", "function": {"name": "shell"}},
        ),
        (None, None),
    ],
)
def test_tool_choice(tool_choice: Any, expected: Any) -> None:
    body = {"input": "x", "tools": [SHELL_TOOL, APPLY_PATCH_TOOL], "tool_choice": tool_choice}
    assert parse(body).tool_choice == expected


def test_allowed_tools_naming_a_subset_is_refused_by_name_not_widened() -> None:
    choice = {
        "type": "allowed_tools",
        "mode": "auto",
        "tools": [{"type": "function", "name": "shell"}],
    }
    with pytest.raises(InvalidRequest, match="allowed_tools naming some but not all"):
        parse({"input": "x", "tools": [SHELL_TOOL, APPLY_PATCH_TOOL], "tool_choice": choice})


def test_tool_choice_is_dropped_without_tools() -> None:
    request = parse({"input": "x", "tools": [], "tool_choice": "required"})
    assert request.tools == []
    assert request.tool_choice is None
    assert "tool_choice" not in request.chat_body()


@pytest.mark.conformance(
    feature="server tools (web_search, ...)", api="openai_responses", status="refused"
)
@pytest.mark.parametrize(
    "kind",
    [
        "web_search",
        "web_search_preview",
        "file_search",
        "computer_use_preview",
        "code_interpreter",
        "image_generation",
        "mcp",
    ],
)
def test_hosted_tools_are_refused_by_name_not_dropped(kind: str) -> None:
    """Dropped, the reply's ``tools`` would echo them as available to a model never shown
    them: the request is refused naming the tool, as for Anthropic's server tools."""
    tools = [{"type": kind}, {"type": "function", "name": "f"}]
    with pytest.raises(InvalidRequest, match=f"hosted tool '{kind}'"):
        parse({"input": "x", "tools": tools})
    with pytest.raises(InvalidRequest, match=f"hosted tool '{kind}'"):
        parse({"input": "x", "tools": tools[1:], "tool_choice": {"type": kind}})


@pytest.mark.parametrize(
    "item",
    [
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA..."},
        {"type": "compaction_trigger"},
        {"type": "context_compaction", "encrypted_content": "gAAAA..."},
    ],
    ids=lambda item: item["type"],
)
def test_remote_compaction_items_are_refused_by_name_never_skipped(item: dict[str, Any]) -> None:
    """OpenAI's server-side compaction (Codex's for a provider named openai or azure: a
    ``compaction_trigger`` as the last input item, then ``compaction`` items in later inputs)
    is opaque state nothing here can make or read: a 400 naming the item and the way out."""
    items = [{"role": "user", "content": "hi"}, item]
    with pytest.raises(InvalidRequest, match=f"input item type '{item['type']}'") as caught:
        parse({"input": items})
    assert "Codex compacts locally" in caught.value.message
    assert caught.value.status == 400
    assert PROVIDER.error_body(caught.value)["error"]["type"] == "invalid_request_error"


def test_the_compact_endpoint_is_refused_by_name() -> None:
    """POST /responses/compact (older Codex's remote compaction, the SDK's
    ``responses.compact``) is a 400 naming the endpoint, whatever the body."""
    ctx = RequestContext(path="/s/key/v1/responses/compact", method="POST")
    body = {"model": "m", "input": [{"role": "user", "content": "hi"}]}
    with pytest.raises(InvalidRequest, match="POST /responses/compact is not served") as caught:
        PROVIDER.parse_request(body, ctx)
    assert "named neither 'OpenAI' nor 'azure'" in caught.value.message
    assert PROVIDER.error_body(caught.value)["error"]["code"] == "invalid_request"


@pytest.mark.conformance(feature="item_reference", api="openai_responses", status="refused")
def test_an_item_reference_is_answered_not_found_never_skipped() -> None:
    items = [{"role": "user", "content": "hi"}, {"type": "item_reference", "id": "msg_old"}]
    with pytest.raises(NotFound, match="Item with id 'msg_old' not found") as caught:
        parse({"input": items})
    assert PROVIDER.error_body(caught.value)["error"]["type"] == "not_found_error"
    assert caught.value.status == 404


@pytest.mark.parametrize(
    "body",
    [
        [],
        "text",
        {"input": 5},
        {"input": [5]},
        {"input": [{"content": "no role or type"}]},
        {"input": [{"role": "tool", "content": "x"}]},
        {"input": [{"role": "user", "content": [{"type": "input_audio"}]}]},
        {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}]},
        {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
        {"input": [{"role": "developer", "content": [{"type": "input_image", "image_url": "u"}]}]},
        {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
        {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": 3}]},
        {"input": [{"type": "function_call_output", "output": "x"}]},
        {"input": [{"type": "custom_tool_call", "call_id": "c", "name": "f"}]},
        {"input": [{"type": "local_shell_call", "call_id": "c", "action": {"command": "ls"}}]},
        {"input": [{"type": "reasoning", "summary": "text"}]},
        {"input": [{"type": "reasoning", "summary": [{"type": "summary_text"}]}]},
        {"input": "x", "model": 3},
        {"input": "x", "instructions": ["a"]},
        {"input": "x", "stream": "yes"},
        {"input": "x", "max_output_tokens": "100"},
        {"input": "x", "temperature": True},
        {"input": "x", "top_k": 1.5},
        {"input": "x", "tools": {"type": "function"}},
        {"input": "x", "tools": [{"type": "function"}]},
        {"input": "x", "tools": [{"name": "f"}]},
        {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": []}]},
        {"input": "x", "tool_choice": "any"},
        {"input": "x", "tool_choice": {"type": "function"}},
        {"input": "x", "include": "reasoning.encrypted_content"},
        {"input": "x", "reasoning": "high"},
        {"input": "x", "previous_response_id": 7},
    ],
)
def test_malformed_requests_are_invalid_request(body: Any) -> None:
    with pytest.raises(InvalidRequest):
        parse(body)


# --------------------------------------------------------------------------- SDK harness


Engine = Callable[[NormalizedRequest], Completion]


class FakeGateway:
    """Runs the adapter the way the gateway does, behind an httpx mock transport."""

    def __init__(self, engine: Engine | None = None, error: GatewayError | None = None) -> None:
        self.engine = engine
        self.error = error
        self.requests: list[NormalizedRequest] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        ctx = RequestContext(path=request.url.path, method=request.method)
        operation = PROVIDER.operation(ctx)
        assert operation is not None
        try:
            if self.error is not None:
                raise self.error
            normalized = PROVIDER.parse_request(json.loads(request.content), ctx)
            self.requests.append(normalized)
            if operation == COUNT_TOKENS:
                return httpx.Response(200, json=PROVIDER.render_token_count(42))
            assert self.engine is not None
            completion = self.engine(normalized)
        except GatewayError as err:
            return httpx.Response(err.status, json=PROVIDER.error_body(err))
        if normalized.stream:
            body = b"".join(PROVIDER.render_stream(completion, normalized))
            return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
        return httpx.Response(
            200, content=orjson.dumps(PROVIDER.render_response(completion, normalized))
        )

    def client(self) -> openai.OpenAI:
        return sdk_client(self.handle)


def sdk_client(handler: Callable[[httpx.Request], httpx.Response]) -> openai.OpenAI:
    """The official client over an in-process transport; strict mode validates every reply."""
    return openai.OpenAI(
        api_key="session-key",
        base_url="http://gateway/s/abc/v1",
        max_retries=0,
        # The SDK takes a legacy httpx client at runtime; its annotation names httpx2 only.
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),  # type: ignore[arg-type]
        _strict_response_validation=True,
    )


def answer(**fields: Any) -> Engine:
    def engine(request: NormalizedRequest) -> Completion:
        return Completion(id="chatcmpl-7", model="engine-model", created=1_700_000_000, **fields)

    return engine


TOOL_TURN = {
    "content": "Running the tests.",
    "reasoning": "The user wants tests run; use the shell tool.",
    "tool_calls": [
        ToolCall(id="call_xyz", name="shell", arguments='{"command": ["pytest", "-q"]}')
    ],
    "finish_reason": "tool_calls",
    "prompt_tokens": 321,
    "completion_tokens": 45,
}


def create_kwargs(**extra: Any) -> dict[str, Any]:
    return {
        "model": "gpt-5-codex",
        "instructions": INSTRUCTIONS,
        "input": [{"role": "user", "content": "run the tests"}],
        "tools": [SHELL_TOOL],
        "reasoning": {"effort": "medium", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        **extra,
    }


def assert_tool_turn(response: Any) -> None:
    """The SDK-parsed Response carries exactly TOOL_TURN."""
    assert response.id == "resp_chatcmpl-7"
    assert response.model == "gpt-5-codex"
    assert response.status == "completed"
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    reasoning, message, function_call = response.output
    assert reasoning.summary[0].text == TOOL_TURN["reasoning"]
    assert decode_reasoning(reasoning.encrypted_content) == TOOL_TURN["reasoning"]
    assert message.content[0].text == TOOL_TURN["content"]
    assert response.output_text == TOOL_TURN["content"]
    assert function_call.call_id == "call_xyz"
    assert function_call.name == "shell"
    assert json.loads(function_call.arguments) == {"command": ["pytest", "-q"]}
    assert response.usage.input_tokens == 321
    assert response.usage.output_tokens == 45
    assert response.usage.total_tokens == 366


# --------------------------------------------------------------------------- render via the SDK


def test_non_stream_response_parses_in_the_sdk() -> None:
    gateway = FakeGateway(answer(**TOOL_TURN))
    response = gateway.client().responses.create(**create_kwargs())
    assert_tool_turn(response)
    assert response.tools[0].name == "shell"
    assert response.reasoning.effort == "medium"
    assert gateway.requests[0].stream is False


def test_stream_events_follow_the_grammar() -> None:
    gateway = FakeGateway(answer(**TOOL_TURN))
    events = list(gateway.client().responses.create(**create_kwargs(), stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[0].response.status == "in_progress"
    assert events[0].response.output == []
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [e.output_index for e in done] == [0, 1, 2]
    assert json.loads(done[2].item.arguments) == {"command": ["pytest", "-q"]}
    assert (
        "".join(e.delta for e in events if e.type == "response.output_text.delta")
        == (TOOL_TURN["content"])
    )
    assert_tool_turn(events[-1].response)


def test_stream_helper_accumulates_the_final_response() -> None:
    gateway = FakeGateway(answer(**TOOL_TURN))
    with gateway.client().responses.stream(**create_kwargs()) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == TOOL_TURN["content"]
    assert_tool_turn(final)
    assert gateway.requests[0].stream is True


def test_stream_matches_non_stream() -> None:
    request = parse(create_kwargs())
    completion = answer(**TOOL_TURN)(request)
    frames = PROVIDER.render_stream(completion, request)
    last = json.loads(frames[-1].split(b"data: ", 1)[1])
    assert last["type"] == "response.completed"
    assert last["response"] == PROVIDER.render_response(completion, request)


def test_length_stop_is_incomplete_but_still_completes_the_stream() -> None:
    gateway = FakeGateway(answer(content="partial", finish_reason="length", completion_tokens=8))
    client = gateway.client()
    response = client.responses.create(**create_kwargs(max_output_tokens=8))
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.max_output_tokens == 8
    assert response.output_text == "partial"
    with client.responses.stream(**create_kwargs()) as stream:
        final = stream.get_final_response()
    assert final.status == "incomplete"
    assert final.output_text == "partial"


def test_empty_completion_still_has_a_message() -> None:
    response = FakeGateway(answer()).client().responses.create(**create_kwargs())
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == ""


def test_engine_tool_call_without_id_gets_one() -> None:
    turn = {
        "tool_calls": [ToolCall(id="", name="shell", arguments="{}")],
        "finish_reason": "tool_calls",
    }
    gateway = FakeGateway(answer(**turn))
    response = gateway.client().responses.create(**create_kwargs())
    assert [item.type for item in response.output] == ["function_call"]
    assert response.output[0].call_id.startswith("call_")
    with gateway.client().responses.stream(**create_kwargs()) as stream:
        final: Any = stream.get_final_response()
    assert final.output[0].call_id == response.output[0].call_id


def test_custom_and_local_shell_calls_render_as_their_item_types() -> None:
    turn = {
        "tool_calls": [
            ToolCall(id="call_p", name="apply_patch", arguments=json.dumps({"input": PATCH})),
            ToolCall(
                id="call_s", name="local_shell", arguments='{"command":["ls","-a"],"workdir":"/w"}'
            ),
            ToolCall(id="call_f", name="shell", arguments='{"command":["ls"]}'),
        ],
        "finish_reason": "tool_calls",
    }
    tools = [SHELL_TOOL, APPLY_PATCH_TOOL, {"type": "local_shell"}]
    gateway = FakeGateway(answer(**turn))
    client = gateway.client()
    response = client.responses.create(**create_kwargs(tools=tools))
    patch, shell, function = response.output
    assert (patch.type, patch.call_id, patch.name, patch.input) == (
        "custom_tool_call",
        "call_p",
        "apply_patch",
        PATCH,
    )
    assert (shell.type, shell.call_id) == ("local_shell_call", "call_s")
    assert shell.action.command == ["ls", "-a"]
    assert shell.action.working_directory == "/w"
    assert (function.type, function.name) == ("function_call", "shell")

    events = list(client.responses.create(**create_kwargs(tools=tools), stream=True))
    inputs = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
    assert inputs == [PATCH]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [item.type for item in done] == ["custom_tool_call", "local_shell_call", "function_call"]

    # Replayed as Codex would, the calls come back as the engine produced them.
    replay = parse(
        {"input": [item.model_dump(exclude_none=True) for item in response.output], "tools": tools}
    )
    assert replay.messages == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                call("call_p", "apply_patch", json.dumps({"input": PATCH}, separators=(",", ":"))),
                call("call_s", "local_shell", '{"command":["ls","-a"],"workdir":"/w"}'),
                call("call_f", "shell", '{"command":["ls"]}'),
            ],
        }
    ]


def test_custom_call_with_off_schema_arguments_passes_the_raw_text() -> None:
    turn = {"tool_calls": [ToolCall(id="c", name="apply_patch", arguments='{"patch": "x"}')]}
    response = (
        FakeGateway(answer(**turn))
        .client()
        .responses.create(**create_kwargs(tools=[APPLY_PATCH_TOOL]))
    )
    assert response.output[0].type == "custom_tool_call"
    assert response.output[0].input == '{"patch": "x"}'


def test_undeclared_local_shell_stays_a_function_call() -> None:
    turn = {"tool_calls": [ToolCall(id="c", name="local_shell", arguments='{"command":["ls"]}')]}
    response = FakeGateway(answer(**turn)).client().responses.create(**create_kwargs())
    assert response.output[0].type == "function_call"


def test_tool_call_round_trip_restores_the_sampled_turn() -> None:
    """Render a turn, replay the SDK's items plus a tool result: history equals what was sampled."""
    gateway = FakeGateway(answer(**TOOL_TURN))
    client = gateway.client()
    with client.responses.stream(**create_kwargs()) as stream:
        final = stream.get_final_response()
    history = [{"role": "user", "content": "run the tests"}]
    history += [item.model_dump(exclude_none=True) for item in final.output]
    history.append({"type": "function_call_output", "call_id": "call_xyz", "output": "3 passed"})
    client.responses.create(**create_kwargs(input=history))
    replayed = gateway.requests[1].messages
    assert replayed == [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": "run the tests"},
        {
            "role": "assistant",
            "content": TOOL_TURN["content"],
            "reasoning": TOOL_TURN["reasoning"],
            "tool_calls": [call("call_xyz", "shell", '{"command": ["pytest", "-q"]}')],
        },
        {"role": "tool", "tool_call_id": "call_xyz", "content": "3 passed"},
    ]


def test_reasoning_round_trip_without_summary_text() -> None:
    """Codex may drop the summary; the synthetic blob alone still restores the exact text."""
    request = parse(create_kwargs())
    rendered = PROVIDER.render_response(
        answer(reasoning="a\n\nb ✓", content="ok")(request), request
    )
    reasoning_item = {**rendered["output"][0], "summary": []}
    replay = parse({"input": [reasoning_item, rendered["output"][1]]})
    assert replay.messages == [{"role": "assistant", "content": "ok", "reasoning": "a\n\nb ✓"}]


def test_model_echo_survives_a_policy_rename() -> None:
    request = parse(create_kwargs())
    request.model = "engine/served-model"
    rendered = PROVIDER.render_response(answer(content="x")(request), request)
    assert rendered["model"] == "gpt-5-codex"


def test_input_token_count_endpoint() -> None:
    gateway = FakeGateway()
    counted = gateway.client().responses.input_tokens.count(model="m", input="hello")
    assert counted.input_tokens == 42
    assert gateway.requests[0].messages == [{"role": "user", "content": "hello"}]


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("error", "exception", "error_type"),
    [
        (InvalidRequest("input must be an array"), openai.BadRequestError, "invalid_request_error"),
        (
            AuthenticationFailed("unknown session"),
            openai.AuthenticationError,
            "authentication_error",
        ),
        (NotFound("no such route"), openai.NotFoundError, "not_found_error"),
        (RateLimited("queue full"), openai.RateLimitError, "rate_limit_error"),
        (EngineUnavailable("engine down"), openai.InternalServerError, "server_error"),
    ],
)
def test_errors_raise_the_sdk_exception(
    error: GatewayError, exception: type[openai.APIStatusError], error_type: str
) -> None:
    client = FakeGateway(error=error).client()
    with pytest.raises(exception) as caught:
        client.responses.create(model="m", input="hi")
    assert caught.value.status_code == error.status
    assert caught.value.message.endswith(error.message)
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["type"] == error_type


def test_malformed_body_is_a_bad_request_through_the_sdk() -> None:
    client = FakeGateway(answer(content="x")).client()
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.responses.create(**create_kwargs(tool_choice="any"))


def test_error_body_shape() -> None:
    body = PROVIDER.error_body(GatewayError("boom"))
    assert body == {
        "error": {
            "message": "boom",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    }


def test_parse_does_not_mutate_the_body() -> None:
    body = codex_request()
    before = copy.deepcopy(body)
    parse(body)
    assert body == before


@pytest.mark.parametrize(
    "body", [{"model": "m"}, {"model": "m", "input": ""}, {"model": "m", "input": []}]
)
def test_no_or_empty_input_is_refused(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest, match="input"):
        parse(body)
