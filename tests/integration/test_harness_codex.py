"""OpenAI Codex CLI, the real CLI, two turns through the gateway in a loopback-only sandbox."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polar.engines.scripted import ScriptedReply
from polar.errors import HarnessError
from polar.harnesses.codex import COMPACT_SETTINGS
from polar.schemas.flags import FLAG_WEBSOCKET
from polar.schemas.trajectory import CompactionEvidence, CompactionStep, TraceKind
from polar.stack.demonstrator import shell_tool
from polar.trajectory.registry import create_builder

from .harness_kit import (
    FINAL,
    TASK,
    assert_two_turn_run,
    harness_prefix,
    run_cli,
    run_two_turns,
    shell_call,
)

__all__ = ["harness_prefix"]

pytestmark = pytest.mark.slow


async def test_codex_two_turns(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path, tokenizer: Any
) -> None:
    tool_call = shell_call("codex")
    run = await run_two_turns(live_gateway, tmp_path, harness_prefix, "codex", tool_call)
    assert_two_turn_run(run, tokenizer, "exec_command")
    assert {r.provider for r in run.records} == {"openai_responses"}


async def test_codex_compact_settings_shrink_the_first_prompt(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path, tokenizer: Any
) -> None:
    """The compact preset, through the real CLI: its own instructions file replaces the stock
    base instructions, the skills/permissions/environment blocks and view_image are gone, and
    exec_command still runs the command. Default and compact first prompts are measured in
    SmolLM2 tokens as the gateway rendered them (docs/harnesses.md quotes the figures)."""
    tool_call = shell_call("codex")
    stock = await run_two_turns(
        live_gateway, tmp_path / "stock", harness_prefix, "codex", tool_call
    )
    compact = await run_two_turns(
        live_gateway, tmp_path / "compact", harness_prefix, "codex", tool_call, COMPACT_SETTINGS
    )
    assert_two_turn_run(compact, tokenizer, "exec_command")
    request = compact.records[0].request
    assert request is not None
    texts = [part["text"] for item in request["input"] for part in item.get("content", [])]
    assert texts == [COMPACT_SETTINGS["instructions"], TASK]
    tools = {tool["name"]: tool for tool in request["tools"]}
    assert "exec_command" in tools and "view_image" not in tools
    # the demonstrator's call is the one Codex's own schema asks for: a ``cmd`` string
    schema = tools["exec_command"]["parameters"]
    argument = shell_tool("codex").argument
    assert schema["required"] == [argument] and schema["properties"][argument]["type"] == "string"
    default_ids, compact_ids = stock.records[0].prompt_ids, compact.records[0].prompt_ids
    print(f"codex first prompt: {len(default_ids)} tokens stock, {len(compact_ids)} compact")
    assert len(compact_ids) * 4 < len(default_ids)


# A stdio MCP server (JSON-RPC, one message a line): initialize, tools/list, tools/call. Run by
# `python3`: named `python`, the server did not start under Codex in the sandbox, and Codex left
# its tools out without failing the run.
MCP_SERVER = """
import json, sys
TOOL = {"name": "lookup", "description": "Look a word up.", "inputSchema": {"type": "object",
        "properties": {"word": {"type": "string"}}, "required": ["word"]}}
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, params = msg.get("method"), msg.get("params") or {}
    if method == "initialize":
        result = {"protocolVersion": params.get("protocolVersion", "2025-06-18"),
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "probe", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [TOOL]}
    elif method == "tools/call":
        word = (params.get("arguments") or {}).get("word", "")
        result = {"content": [{"type": "text", "text": "meaning of " + word}]}
    else:
        out = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": method}}
        print(json.dumps(out), flush=True)
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""


async def test_codex_mcp_tools_reach_the_model_and_their_calls_reach_the_server(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path, tokenizer: Any
) -> None:
    """Codex sends its MCP server's tools as a ``namespace`` entry: the model's prompt shows
    the tool under its flat name, the call goes back named apart (Codex routes it to the MCP
    server, whose answer is the next call's tool result), and the two calls merge exactly."""
    settings = {
        **COMPACT_SETTINGS,
        "mcp_servers": {"probe": {"command": "python3", "args": ["-c", MCP_SERVER]}},
    }
    replies = [
        ScriptedReply(tool_calls=[("mcp__probe__lookup", {"word": "polar"})]),
        ScriptedReply(content=FINAL),
    ]
    run = await run_cli(live_gateway, tmp_path, harness_prefix, "codex", replies, settings)
    assert run.outcome.exit_code == 0, run.outcome
    assert len(run.records) == 2, [r.response for r in run.records]
    first, second = run.records
    assert first.request is not None and second.request is not None
    namespaces = [t for t in first.request["tools"] if t["type"] == "namespace"]
    assert [(t["name"], [f["name"] for f in t["tools"]]) for t in namespaces] == [
        ("mcp__probe", ["lookup"])
    ]
    assert "mcp__probe__lookup" in tokenizer.decode(first.prompt_ids)
    assert first.dropped_tools == []
    calls = [i for i in second.request["input"] if i.get("type") == "function_call"]
    assert [(c["name"], c.get("namespace")) for c in calls] == [("lookup", "mcp__probe")]
    outputs = [i for i in second.request["input"] if i.get("type") == "function_call_output"]
    # Codex's MCP result as content items: its own wall-time line, then the server's text
    texts = [part["text"] for item in outputs for part in item["output"]]
    assert texts[-1] == "meaning of polar"
    assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids
    (trace,) = create_builder("prefix_merging").build(run.records).traces
    assert trace.prompt_ids == first.prompt_ids
    assert "meaning of polar" in tokenizer.decode(trace.response_ids)


async def test_codex_over_websocket_is_captured_exactly(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path, tokenizer: Any
) -> None:
    """Codex with its WebSocket transport on (``websocket: true``): both turns are frames on
    the socket (Codex's warm-up, then only the new input on ``previous_response_id``), and the
    capture and the merged trace are what the HTTP run gives."""
    settings = {**COMPACT_SETTINGS, "websocket": True}
    run = await run_two_turns(
        live_gateway, tmp_path, harness_prefix, "codex", shell_call("codex"), settings
    )
    assert_two_turn_run(run, tokenizer, "exec_command")
    assert all(FLAG_WEBSOCKET in record.flags for record in run.records), run.records
    second = run.records[1].request
    assert second is not None and second.get("previous_response_id"), second


# Codex compacts when a response's token usage reaches model_auto_compact_token_limit. The
# first prompt is ~1.2k tokens (the compact preset), the second holds a ~0.6k-token tool output,
# so the second response crosses 1450 and Codex compacts before its next call; the compacted
# history (~1.3k) stays under it until the run ends. Keys as Codex 0.169.0 reads them.
COMPACT_AT = 1450
SMALL_WINDOW = {"model_auto_compact_token_limit": COMPACT_AT, "model_context_window": 4096}
CODEX_ASK = "You are performing a CONTEXT CHECKPOINT COMPACTION"
SUMMARY = "Listed 200 numbers and echoed step1; proof.txt is not written yet."


def compacting(**config: Any) -> dict[str, Any]:
    """The compact preset with a context small enough that Codex compacts."""
    return {
        **COMPACT_SETTINGS,
        "config": {**COMPACT_SETTINGS["config"], **SMALL_WINDOW, **config},
    }


def _texts(item: dict[str, Any]) -> str:
    return "\n".join(part.get("text", "") for part in item.get("content") or [])


async def test_codex_compaction_is_one_tree_of_exact_traces(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path
) -> None:
    """Real Codex with a small context compacts locally (the preset's provider is neither
    openai nor azure): on the wire, a summary request (its history, Codex's compaction ask,
    no tools) and then a new history (the first messages and the summary) in the thread's next
    context window. The session is one tree: the main trace, the summary request's trace and
    the compacted history's trace, both compaction children of the main trace's last call,
    every merged context exact."""
    replies = [
        ScriptedReply(tool_calls=[shell_call("codex", "seq 1 200")]),
        ScriptedReply(tool_calls=[shell_call("codex", "echo step1")]),
        ScriptedReply(content=SUMMARY),
        ScriptedReply(tool_calls=[shell_call("codex")]),
        ScriptedReply(content=FINAL),
    ]
    run = await run_cli(live_gateway, tmp_path, harness_prefix, "codex", replies, compacting())
    assert run.outcome.exit_code == 0, run.outcome
    assert (run.workspace / "proof.txt").read_text() == "polar\n"
    assert len(run.records) == 5, [r.response for r in run.records]
    main1, main2, asked, after1, after2 = run.records
    # the compaction, as Codex sent it
    assert asked.request is not None and after1.request is not None
    assert not asked.request.get("tools")
    ask = asked.request["input"][-1]
    assert ask["role"] == "user" and _texts(ask).startswith(CODEX_ASK)
    assert asked.response["content"] == SUMMARY
    carried = [_texts(i) for i in after1.request["input"] if i.get("role") == "user"]
    assert carried[-1].endswith(SUMMARY) and "produced a summary" in carried[-1]
    windows = [r.harness_ids.window if r.harness_ids else None for r in run.records]
    assert windows == [0, 0, 0, 1, 1]

    trajectory = create_builder("prefix_merging").build(run.records)
    traces = {t.stats.completion_ids[0]: t for t in trajectory.traces}
    assert len(traces) == 3
    main = traces[main1.completion_id]
    assert main.stats.completion_ids == [main1.completion_id, main2.completion_id]
    summary = traces[asked.completion_id].lineage
    assert summary is not None and summary.compaction is not None
    assert (summary.kind, summary.compaction.step) == (TraceKind.COMPACTION, CompactionStep.SUMMARY)
    assert summary.compaction.evidence == [CompactionEvidence.CODEX_SUMMARY_PROMPT]
    assert summary.parent_call == main2.completion_id
    compacted = traces[after1.completion_id]
    lineage = compacted.lineage
    assert lineage is not None and lineage.compaction is not None
    assert (lineage.kind, lineage.compaction.step) == (
        TraceKind.COMPACTION,
        CompactionStep.CONTINUATION,
    )
    assert lineage.compaction.evidence == [
        CompactionEvidence.CODEX_SUMMARY_MESSAGE,
        CompactionEvidence.CODEX_WINDOW,
    ]
    assert lineage.compaction.summary_call == asked.completion_id
    assert lineage.parent_call == main2.completion_id
    assert compacted.stats.completion_ids == [after1.completion_id, after2.completion_id]
    index = trajectory.traces.index(main)
    assert summary.parent_trace == lineage.parent_trace == index
    assert main.lineage is not None and main.lineage.parent_call is None
    for trace in trajectory.traces:
        assert trace.lineage is not None and not trace.lineage.disagreements
        assert trace.stats.context_exact_calls == trace.stats.merged_calls
    assert trajectory.stats.merged_calls == trajectory.stats.context_exact_calls == 2


async def test_codex_remote_compaction_is_refused_by_name(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path
) -> None:
    """With its provider named "azure" (or "OpenAI") Codex compacts remotely: a /responses
    call ending in a compaction_trigger item, answered by OpenAI's service with an encrypted
    compaction item. The gateway refuses it by name (nothing captured, no engine call); Codex,
    which has no fallback to local compaction, ends the run with that message."""
    replies = [
        ScriptedReply(tool_calls=[shell_call("codex", "seq 1 200")]),
        ScriptedReply(tool_calls=[shell_call("codex", "echo step1")]),
        ScriptedReply(content=SUMMARY),
    ]
    settings = compacting(model_providers={"polar": {"name": "azure"}})
    with pytest.raises(HarnessError) as failed:
        await run_cli(live_gateway, tmp_path, harness_prefix, "codex", replies, settings)
    assert "input item type 'compaction_trigger' is not supported" in str(failed.value)
    assert len(live_gateway.engine_log) == 2


REVIEW = json.dumps(
    {
        "findings": [],
        "overall_correctness": "patch is correct",
        "overall_explanation": "Nothing to change.",
        "overall_confidence_score": 0.9,
    }
)


async def test_codex_review_is_a_review_subagent_trace_by_its_headers(
    live_gateway: Any, tmp_path: Path, harness_prefix: Path
) -> None:
    """Real ``codex exec review``: Codex runs the review as a sub-agent of a root thread that
    makes no model call itself. Its calls carry Codex's own ids (a thread of its own, the
    root thread as its parent, ``x-openai-subagent: review``); the session tree is one review
    trace of both calls, kind subagent by the headers, and prefix inference agrees."""
    replies = [
        ScriptedReply(tool_calls=[shell_call("codex", "ls")]),
        ScriptedReply(content=REVIEW),
    ]
    run = await run_cli(live_gateway, tmp_path, harness_prefix, "codex", replies, {"review": True})
    assert run.outcome.exit_code == 0, run.outcome
    assert "Nothing to change." in run.outcome.stdout_tail
    assert len(run.records) == 2, [r.response for r in run.records]
    ids = [r.harness_ids for r in run.records]
    assert ids[0] is not None and ids[0] == ids[1]
    assert (ids[0].cli, ids[0].subagent) == ("codex", "review")
    assert ids[0].parent == ids[0].session != ids[0].agent
    trajectory = create_builder("prefix_merging").build(run.records)
    (trace,) = trajectory.traces
    assert trace.stats.completion_ids == [r.completion_id for r in run.records]
    assert trace.lineage is not None
    assert (trace.lineage.kind, trace.lineage.parent_call) == (TraceKind.SUBAGENT, None)
    assert trace.lineage.harness == ids[0]
    assert trace.lineage.disagreements == []
    assert trajectory.stats.merged_calls == trajectory.stats.context_exact_calls == 1
