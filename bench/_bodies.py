"""Realistic request bodies for the gateway benchmark, generated (deterministically) at run time.

One neutral conversation (system text, tools, turns) is rendered into each provider's wire shape,
so every provider carries the same content:

* ``claude_code``: sized so the Anthropic body is ~80 KB, like Claude Code's: system blocks (with
  the per-call billing line), a ``role: "system"`` message inside ``messages``, 15 tools with long
  descriptions and JSON schemas, ``thinking: adaptive``, and a history of tool calls and results.
* ``pi``: sized so the Chat Completions body is ~5 KB, like Pi's: one system prompt, 4 tools, a
  short history.

Text is drawn from a word list with a fixed seed: realistic to compress and parse, never random
between runs.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import orjson

PROVIDERS = ("anthropic", "openai_chat", "openai_responses", "google")
BODIES = {"claude_code": ("anthropic", 80_000), "pi": ("openai_chat", 5_000)}

_VOCABULARY = (
    "the a file tool call must should never always use run read edit write path repository test "
    "command output user request when before after only if then else you your code change "
    "function class module import return value error message line lines directory search pattern "
    "result results context model agent task step plan check verify commit branch diff patch "
    "format style lint type types string number list object field fields schema parameter "
    "parameters description example examples note important instead prefer avoid ensure include "
    "exclude relative absolute working current shell bash process timeout background job status "
    "exit code stdout stderr unless explicitly asked existing new create update delete remove "
    "multiple single concise clear brief explain summarize output markdown json yaml config "
    "environment variable package dependency install build compile server client request response"
)
_WORDS = _VOCABULARY.split()


def words(rng: random.Random, n_bytes: int) -> str:
    """Plain prose of about ``n_bytes`` characters."""
    out: list[str] = []
    size = 0
    while size < n_bytes:
        sentence = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 18)))
        sentence = sentence[0].upper() + sentence[1:] + ". "
        out.append(sentence)
        size += len(sentence)
    return "".join(out)[:n_bytes]


def code(rng: random.Random, n_bytes: int) -> str:
    """Python-looking file contents with line numbers, as a read tool returns them."""
    lines: list[str] = []
    size = 0
    while size < n_bytes:
        name = "_".join(rng.choice(_WORDS) for _ in range(2))
        line = rng.choice(
            [
                f"def {name}(value: str) -> str:",
                f"    return {name}.strip()",
                f"    if not {name}:",
                f"        raise ValueError('{name} is required')",
                f"from app.{name} import {name.title().replace('_', '')}",
                f"# {' '.join(rng.choice(_WORDS) for _ in range(8))}",
                f"{name.upper()} = {rng.randint(0, 10_000)}",
            ]
        )
        line = f"{len(lines) + 1:>6}\t{line}"
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:n_bytes]


@dataclass
class ToolSpec:
    name: str
    description: str
    schema: dict[str, Any]


@dataclass
class Turn:
    """A user text, an assistant message (text and calls), or one tool result."""

    role: str
    text: str = ""
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    call_id: str = ""
    tool_name: str = ""


@dataclass
class Conversation:
    system: list[str]
    tools: list[ToolSpec]
    turns: list[Turn]
    model: str
    max_tokens: int
    in_messages_system: str = ""
    billing_line: str = ""


def _schema(rng: random.Random, props: list[str], required: int) -> dict[str, Any]:
    properties = {
        p: {
            "type": rng.choice(["string", "string", "integer", "boolean"]),
            "description": words(rng, 90),
        }
        for p in props
    }
    return {
        "type": "object",
        "properties": properties,
        "required": props[:required],
        "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#",
    }


_CLAUDE_TOOLS = (
    ("Task", ["description", "prompt", "subagent_type"], 3, 3200),
    ("Bash", ["command", "timeout", "description", "run_in_background"], 1, 4200),
    ("Glob", ["pattern", "path"], 1, 700),
    (
        "Grep",
        ["pattern", "path", "glob", "output_mode", "-i", "-n", "head_limit", "multiline"],
        1,
        1600,
    ),
    ("LS", ["path", "ignore"], 1, 400),
    ("ExitPlanMode", ["plan"], 1, 800),
    ("Read", ["file_path", "offset", "limit"], 1, 1400),
    ("Edit", ["file_path", "old_string", "new_string", "replace_all"], 3, 1300),
    ("MultiEdit", ["file_path", "edits"], 2, 1900),
    ("Write", ["file_path", "content"], 2, 700),
    ("NotebookEdit", ["notebook_path", "cell_id", "new_source", "cell_type", "edit_mode"], 3, 600),
    ("WebFetch", ["url", "prompt"], 2, 1200),
    ("TodoWrite", ["todos"], 1, 5200),
    ("WebSearch", ["query", "allowed_domains", "blocked_domains"], 1, 900),
    ("BashOutput", ["bash_id", "filter"], 1, 400),
)

_PI_TOOLS = (
    ("read", ["path", "offset", "limit"], 1, 260),
    ("bash", ["command", "timeout"], 1, 260),
    ("edit", ["path", "oldText", "newText"], 3, 240),
    ("write", ["path", "content"], 2, 180),
)


def _history(
    rng: random.Random, rounds: list[tuple[str, dict[str, Any], int]], task: str
) -> list[Turn]:
    turns = [Turn("user", text=task)]
    for i, (tool, args, result_bytes) in enumerate(rounds):
        call_id = f"toolu_{i:02d}{rng.randrange(16**20):020x}"
        turns.append(Turn("assistant", text=words(rng, 120), calls=[(call_id, tool, args)]))
        turns.append(Turn("tool", text=code(rng, result_bytes), call_id=call_id, tool_name=tool))
    return turns


def claude_code(system_bytes: int) -> Conversation:
    rng = random.Random(80)
    tools = [ToolSpec(n, words(rng, d), _schema(rng, p, r)) for n, p, r, d in _CLAUDE_TOOLS]
    rounds: list[tuple[str, dict[str, Any], int]] = [
        ("Glob", {"pattern": "src/**/*.py"}, 1500),
        ("Read", {"file_path": "/repo/src/app/main.py"}, 5000),
        ("Grep", {"pattern": "def handle_", "output_mode": "content", "-n": True}, 2500),
        ("Read", {"file_path": "/repo/src/app/handlers.py"}, 5000),
        (
            "Edit",
            {"file_path": "/repo/src/app/handlers.py", "old_string": "x", "new_string": "y"},
            600,
        ),
        (
            "Bash",
            {"command": "python -m pytest -q tests/test_handlers.py", "timeout": 120000},
            2500,
        ),
    ]
    task = "<system-reminder>\n" + words(rng, 1500) + "\n</system-reminder>\n" + words(rng, 300)
    return Conversation(
        system=[
            "You are Claude Code, Anthropic's official CLI for Claude.",
            words(rng, system_bytes),
        ],
        tools=tools,
        turns=_history(rng, rounds, task),
        model="claude-sonnet-4-5",
        max_tokens=32_000,
        in_messages_system=words(rng, 600),
        billing_line="x-anthropic-billing-header: cc_version=2.1.197.a1b; cc_entrypoint=sdk-cli",
    )


def pi(system_bytes: int) -> Conversation:
    rng = random.Random(5)
    tools = [ToolSpec(n, words(rng, d), _schema(rng, p, r)) for n, p, r, d in _PI_TOOLS]
    rounds: list[tuple[str, dict[str, Any], int]] = [
        ("read", {"path": "src/main.py"}, 500),
        ("bash", {"command": "pytest -q"}, 300),
    ]
    return Conversation(
        system=[words(rng, system_bytes)],
        tools=tools,
        turns=_history(rng, rounds, words(rng, 200)),
        model="polar/bench-model",
        max_tokens=16_384,
    )


# -- renderers --------------------------------------------------------------------------------


def anthropic(conv: Conversation, stream: bool) -> dict[str, Any]:
    system: list[dict[str, Any]] = []
    if conv.billing_line:
        system.append({"type": "text", "text": conv.billing_line})
    for text in conv.system:
        system.append({"type": "text", "text": text, "cache_control": {"type": "ephemeral"}})
    messages: list[dict[str, Any]] = []
    if conv.in_messages_system:
        messages.append({"role": "system", "content": conv.in_messages_system})
    for turn in conv.turns:
        if turn.role == "user":
            messages.append({"role": "user", "content": [{"type": "text", "text": turn.text}]})
        elif turn.role == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": turn.text}]
            blocks += [
                {"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in turn.calls
            ]
            messages.append({"role": "assistant", "content": blocks})
        else:
            result = {"type": "tool_result", "tool_use_id": turn.call_id, "content": turn.text}
            messages.append({"role": "user", "content": [result]})
    body: dict[str, Any] = {
        "model": conv.model,
        "max_tokens": conv.max_tokens,
        "system": system,
        "messages": messages,
        "tools": [
            {"name": t.name, "description": t.description, "input_schema": t.schema}
            for t in conv.tools
        ],
        "metadata": {"user_id": "user_bench_account__session_0000"},
        "stream": stream,
    }
    if conv.billing_line:
        body["thinking"] = {"type": "adaptive"}
    return body


def openai_chat(conv: Conversation, stream: bool) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "\n\n".join(conv.system)}]
    if conv.in_messages_system:
        messages.append({"role": "system", "content": conv.in_messages_system})
    for turn in conv.turns:
        if turn.role == "user":
            messages.append({"role": "user", "content": turn.text})
        elif turn.role == "assistant":
            calls = [
                {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                for i, n, a in turn.calls
            ]
            messages.append({"role": "assistant", "content": turn.text, "tool_calls": calls})
        else:
            messages.append({"role": "tool", "tool_call_id": turn.call_id, "content": turn.text})
    body: dict[str, Any] = {
        "model": conv.model,
        "messages": messages,
        "tools": [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.schema},
            }
            for t in conv.tools
        ],
        "max_tokens": conv.max_tokens,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def openai_responses(conv: Conversation, stream: bool) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    if conv.in_messages_system:
        items.append({"type": "message", "role": "developer", "content": conv.in_messages_system})
    for turn in conv.turns:
        if turn.role == "user":
            text = {"type": "input_text", "text": turn.text}
            items.append({"type": "message", "role": "user", "content": [text]})
        elif turn.role == "assistant":
            said = {"type": "output_text", "text": turn.text, "annotations": []}
            items.append({"type": "message", "role": "assistant", "content": [said]})
            items += [
                {"type": "function_call", "call_id": i, "name": n, "arguments": json.dumps(a)}
                for i, n, a in turn.calls
            ]
        else:
            items.append(
                {"type": "function_call_output", "call_id": turn.call_id, "output": turn.text}
            )
    return {
        "model": conv.model,
        "instructions": "\n\n".join(conv.system),
        "input": items,
        "tools": [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.schema,
                "strict": False,
            }
            for t in conv.tools
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "store": False,
        "stream": stream,
    }


def google(conv: Conversation, stream: bool) -> dict[str, Any]:
    """The body only: Gemini chooses streaming by URL (see :func:`path`)."""
    del stream
    contents: list[dict[str, Any]] = []
    for turn in conv.turns:
        if turn.role == "user":
            contents.append({"role": "user", "parts": [{"text": turn.text}]})
        elif turn.role == "assistant":
            parts: list[dict[str, Any]] = [{"text": turn.text}]
            parts += [{"functionCall": {"id": i, "name": n, "args": a}} for i, n, a in turn.calls]
            contents.append({"role": "model", "parts": parts})
        else:
            response = {
                "id": turn.call_id,
                "name": turn.tool_name,
                "response": {"output": turn.text},
            }
            contents.append({"role": "user", "parts": [{"functionResponse": response}]})
    system = conv.system + ([conv.in_messages_system] if conv.in_messages_system else [])
    return {
        "contents": contents,
        "systemInstruction": {"role": "user", "parts": [{"text": t} for t in system]},
        "tools": [
            {
                "functionDeclarations": [
                    {"name": t.name, "description": t.description, "parametersJsonSchema": t.schema}
                    for t in conv.tools
                ]
            }
        ],
        "generationConfig": {"temperature": 1, "maxOutputTokens": conv.max_tokens},
    }


RENDERERS = {
    "anthropic": anthropic,
    "openai_chat": openai_chat,
    "openai_responses": openai_responses,
    "google": google,
}


def path(provider: str, stream: bool, model: str) -> str:
    """The URL path (below the session prefix) each provider's SDK posts to."""
    if provider == "anthropic":
        return "/v1/messages?beta=true"
    if provider == "openai_chat":
        return "/v1/chat/completions"
    if provider == "openai_responses":
        return "/v1/responses"
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return f"/v1beta/models/{model}:{method}"


def headers(provider: str, key: str) -> dict[str, str]:
    """The auth and version headers each SDK sends."""
    if provider == "anthropic":
        return {"x-api-key": key, "anthropic-version": "2023-06-01"}
    if provider == "google":
        return {"x-goog-api-key": key}
    return {"authorization": f"Bearer {key}"}


def conversation(name: str) -> Conversation:
    """The named conversation, its system prompt sized so its home provider's body hits the target."""
    build = {"claude_code": claude_code, "pi": pi}[name]
    home, target = BODIES[name]
    trial = build(1000)
    size = len(orjson.dumps(RENDERERS[home](trial, False)))
    return build(max(100, 1000 + target - size))


def body(name: str, provider: str, stream: bool) -> dict[str, Any]:
    return RENDERERS[provider](conversation(name), stream)
