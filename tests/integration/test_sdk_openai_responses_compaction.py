"""Compaction through the openai SDK, in both render modes.

Remote compaction (OpenAI's service summarising into an opaque, encrypted ``compaction`` item:
``POST /responses/compact``, a ``compaction_trigger`` input item) is refused by name, before any
engine call. Local compaction (what Codex does for a provider not named openai or azure) is two
ordinary calls, replayed here as Codex 0.169.0 sends them: the history plus its compaction ask
with no tools, then a new history of the first messages and the summary. The session builds
into one tree of traces (the compacted history a compaction child of the main trace), every
merged context the engine's own prompt.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from polar.engines.scripted import ScriptedReply
from polar.schemas.trajectory import CompactionStep, TraceKind
from polar.trajectory.registry import create_builder

pytestmark = pytest.mark.slow

EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command in a PTY, returning output.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}},
        "required": ["cmd"],
    },
}
FIRST = [
    {"role": "developer", "content": "You are a coding agent."},
    {"role": "user", "content": "Create proof.txt holding the word polar."},
]
ASK = "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary."
SUMMARY = "Listed the directory; proof.txt does not exist yet. Next: write it."
SUMMARY_PREFIX = (
    "Another language model started to solve this problem and produced a summary of its "
    "thinking process. Here is the summary produced by the other language model:"
)


def _modes(feature: str, status: str) -> list[Any]:
    return [
        pytest.param(
            mode,
            marks=pytest.mark.conformance(
                feature=f"{feature} ({mode} rendering)", api="openai_responses", status=status
            ),
            id=mode,
        )
        for mode in ("engine", "gateway")
    ]


def _client(gateway: Any) -> tuple[Any, openai.OpenAI]:
    gateway.reset()
    session = gateway.new_session()
    client = openai.OpenAI(base_url=session.base_urls["openai"], api_key=session.key, max_retries=0)
    return session, client


@pytest.mark.parametrize(
    "noncanonical_gateway",
    _modes("remote compaction: POST /responses/compact", "refused"),
    indirect=True,
)
def test_the_compact_endpoint_is_refused_by_name(noncanonical_gateway: Any) -> None:
    gateway = noncanonical_gateway
    session, client = _client(gateway)
    with pytest.raises(openai.BadRequestError, match="POST /responses/compact is not served"):
        client.responses.compact(model="m", input=[{"role": "user", "content": "hi"}])
    assert gateway.records(session.key) == [] and gateway.engine_log == []


@pytest.mark.parametrize(
    "noncanonical_gateway",
    _modes("remote compaction: compaction / compaction_trigger items", "refused"),
    indirect=True,
)
def test_compaction_items_are_refused_by_name(noncanonical_gateway: Any) -> None:
    gateway = noncanonical_gateway
    session, client = _client(gateway)
    opaque = {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAB..."}
    for item, stream in (({"type": "compaction_trigger"}, True), (opaque, False)):
        with pytest.raises(openai.BadRequestError, match=f"input item type '{item['type']}'"):
            client.responses.create(model="m", input=[*FIRST, item], stream=stream, store=False)
    assert gateway.records(session.key) == [] and gateway.engine_log == []


@pytest.mark.parametrize(
    "noncanonical_gateway", _modes("Codex local compaction", "supported"), indirect=True
)
def test_a_locally_compacted_session_is_one_exact_tree(noncanonical_gateway: Any) -> None:
    gateway = noncanonical_gateway
    session, client = _client(gateway)
    gateway.script(
        ScriptedReply(tool_calls=[("exec_command", {"cmd": "ls"})]),
        ScriptedReply(tool_calls=[("exec_command", {"cmd": "cat README"})]),
        ScriptedReply(content=SUMMARY),
        ScriptedReply(tool_calls=[("exec_command", {"cmd": "echo polar > proof.txt"})]),
        ScriptedReply(content="Done."),
    )
    kwargs: dict[str, Any] = {"model": "m", "store": False}

    def turn(items: list[Any], output: str, **extra: Any) -> list[Any]:
        """One call; the history with its function call and output appended."""
        reply = client.responses.create(input=items, **kwargs, **extra)
        (call,) = reply.output
        done = {"type": "function_call_output", "call_id": call.call_id, "output": output}
        return [*items, call.model_dump(exclude_none=True), done]

    history = turn(list(FIRST), "README", tools=[EXEC])
    history = turn(history, "polar is a word", tools=[EXEC])
    asked = client.responses.create(input=[*history, {"role": "user", "content": ASK}], **kwargs)
    assert asked.output_text == SUMMARY
    compacted = [*FIRST, {"role": "user", "content": f"{SUMMARY_PREFIX}\n{asked.output_text}"}]
    compacted = turn(compacted, "", tools=[EXEC])
    assert client.responses.create(input=compacted, tools=[EXEC], **kwargs).output_text == "Done."

    records = gateway.records(session.key)
    assert len(records) == 5
    main1, main2, summary, after1, after2 = records
    trajectory = create_builder("prefix_merging").build(records)
    by_first = {t.stats.completion_ids[0]: t for t in trajectory.traces}
    lineage = by_first[after1.completion_id].lineage
    assert lineage is not None and lineage.compaction is not None
    assert (lineage.kind, lineage.compaction.step) == (
        TraceKind.COMPACTION,
        CompactionStep.CONTINUATION,
    )
    assert lineage.compaction.summary_call == summary.completion_id
    assert lineage.parent_call == main2.completion_id
    asking = by_first[summary.completion_id].lineage
    assert asking is not None and asking.compaction is not None
    assert asking.compaction.step is CompactionStep.SUMMARY
    assert asking.parent_call == main2.completion_id
    for trace in trajectory.traces:
        assert trace.lineage is not None
        if trace.lineage.parent_call is None:
            assert trace.lineage.kind is TraceKind.MAIN
            assert trace.stats.completion_ids[0] == main1.completion_id
        else:
            holder = trajectory.traces[trace.lineage.parent_trace or 0]
            assert trace.lineage.parent_call in holder.stats.completion_ids
        assert trace.stats.context_exact_calls == trace.stats.merged_calls
    if gateway.render_mode == "gateway":
        # token-in: each agent's calls merge (main: 2 calls, the compacted history: 2 calls)
        assert trajectory.stats.merged_calls == trajectory.stats.context_exact_calls == 2
        assert by_first[after1.completion_id].stats.completion_ids == [
            after1.completion_id,
            after2.completion_id,
        ]
    gateway.reset()
