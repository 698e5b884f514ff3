"""Property tests: random agent sessions rendered by real chat templates always merge cleanly.

Sessions interleave up to three agents (distinct system prompts and tasks), random replies
with and without tool calls, tool results, new user queries, length-stopped turns, replies
sampled in a tokenization the template does not reproduce (drift) and tagged side calls. Whatever the mix: one trace per agent, trainable tokens are exactly the sampled
ones with their logprobs, and every captured call is accounted for.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.trajectory.per_request import PerRequestBuilder
from polar.trajectory.prefix_merging import PrefixMergingBuilder

from .sessions import TOOLS, Agent, record

WORDS = ["the", "test", "file", "passes", "now", "I", "will", "check", "it", "fixed", "ok", "run"]

turn = st.fixed_dictionaries(
    {
        "words": st.lists(st.sampled_from(WORDS), min_size=1, max_size=8),
        "tool": st.booleans(),
        "reasoning": st.lists(st.sampled_from(WORDS), min_size=1, max_size=5),
        "next": st.sampled_from(["tool", "user"]),
        "max_tokens": st.none() | st.integers(min_value=2, max_value=6),
        "split_text": st.booleans(),
    }
)
session = st.fixed_dictionaries(
    {
        "agents": st.lists(st.lists(turn, min_size=1, max_size=5), min_size=1, max_size=3),
        "order": st.lists(st.integers(min_value=0, max_value=2), max_size=20),
        "side_calls": st.lists(st.booleans(), max_size=3),
    }
)
SETTINGS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def play(tok: Any, spec: dict[str, Any], *, thinking: bool | None = None) -> tuple[list, list]:
    """Run the session; returns (agents, all records in capture order)."""
    kwargs: dict[str, Any] = {}
    if thinking is not None:
        kwargs = {"plain_tools": False, "enable_thinking": thinking}
    agents = [
        Agent(tok, system=f"You are agent {i}.", task=f"Task {i}: fix it.", tools=TOOLS, **kwargs)
        for i in range(len(spec["agents"]))
    ]
    pending = [list(turns) for turns in spec["agents"]]
    order = [i % len(agents) for i in spec["order"]]
    order += [i for i, turns in enumerate(pending) for _ in turns]  # every turn gets played
    records = []
    sides = list(spec["side_calls"])
    for i in order:
        if not pending[i]:
            continue
        t = pending[i].pop(0)
        agent = agents[i]
        prefix = ""
        if thinking:
            prefix = "<think>\n" + " ".join(t["reasoning"]) + "\n</think>\n\n"
        rec = agent.call(
            " ".join(t["words"]).capitalize(),
            tool_cmd="ls" if t["tool"] else None,
            sampled_prefix=prefix,
            max_tokens=None if thinking is not None else t["max_tokens"],
            split_text=t["split_text"],
        )
        if thinking:
            agent.messages[-1]["reasoning_content"] = " ".join(t["reasoning"])
        records.append(rec)
        if t["next"] == "tool":
            agent.tool_result(" ".join(t["words"]))
        else:
            agent.user("Next: " + " ".join(t["reasoning"]))
        if sides and sides.pop():
            records.append(record([1, 2, 3], [4, 2], tags=["side_call:title"]))
    return agents, records


def check_faithful(traj: Any, agents: list[Agent], records: list) -> None:
    by_id = {r.completion_id: r for r in records}
    # one trace per agent, holding exactly that agent's calls in order
    assert sorted(t.metadata["completion_ids"] for t in traj.traces) == sorted(
        [r.completion_id for r in a.records] for a in agents
    )
    for trace in traj.traces:
        calls = [by_id[c] for c in trace.metadata["completion_ids"]]
        sampled = [
            (tok, lp)
            for tok, lp, m in zip(
                trace.response_ids, trace.response_logprobs or [], trace.loss_mask, strict=True
            )
            if m
        ]
        expected = [
            (tok, lp) for r in calls for tok, lp in zip(r.sampled_ids, r.logprobs, strict=True)
        ]
        assert sampled == expected
        assert len(trace.loss_mask) == len(trace.response_ids) == len(trace.response_logprobs)
        assert all(
            lp == 0.0
            for lp, m in zip(trace.response_logprobs, trace.loss_mask, strict=True)
            if not m
        )
        assert trace.prompt_ids == calls[0].prompt_ids
        if trace.metadata["drift_tokens"] == 0 and trace.metadata["repaired_tokens"] == 0:
            last = calls[-1]
            assert trace.prompt_ids + trace.response_ids == last.prompt_ids + last.sampled_ids
    # no captured call unaccounted for
    in_traces = [c for t in traj.traces for c in t.metadata["completion_ids"]]
    excluded = traj.metadata["excluded_side_calls"]
    assert sorted(in_traces + excluded) == sorted(by_id)
    assert traj.metadata["num_calls"] == len(records)


@SETTINGS
@given(spec=session)
def test_smollm2_sessions_merge_one_trace_per_agent_when_tolerant(smollm2, spec):
    """Given the end-of-turn token: a session whose every call stopped at its length limit
    teaches the builder none, and a drifted turn then cannot be located (no_end_of_turn)."""
    agents, records = play(smollm2, spec)
    eot = smollm2.convert_tokens_to_ids("<|im_end|>")
    traj = PrefixMergingBuilder({"context": "tolerant", "eot_token_id": eot}).build(records)
    check_faithful(traj, agents, records)
    assert traj.metadata["breaks"] == {}


@SETTINGS
@given(spec=session)
def test_every_merged_call_saw_exactly_its_trace_context(smollm2, spec):
    """The builder invariant, checked independently of the builder's own bookkeeping: for every
    call of every trace, the trace's tokens before that call's sampled ids are its engine
    prompt. Random drift (non-canonical tokenizations, length stops) only splits traces."""
    _, records = play(smollm2, spec)
    traj = PrefixMergingBuilder().build(records)
    by_id = {r.completion_id: r for r in records}
    merged = 0
    for trace in traj.traces:
        context = list(trace.prompt_ids)
        position = 0
        for cid in trace.metadata["completion_ids"]:
            rec = by_id[cid]
            n = len(rec.prompt_ids) - len(context)
            assert n >= 0
            assert context + trace.response_ids[position : position + n] == rec.prompt_ids
            position += n
            got = trace.response_ids[position : position + len(rec.sampled_ids)]
            assert got == rec.sampled_ids
            assert trace.loss_mask[position : position + len(rec.sampled_ids)] == [1] * len(got)
            position += len(rec.sampled_ids)
            context = list(rec.prompt_ids) + rec.sampled_ids
        assert position == len(trace.response_ids)
        merged += len(trace.metadata["completion_ids"]) - 1
    assert traj.metadata["merged_calls"] == traj.metadata["context_exact_calls"] == merged


@SETTINGS
@given(spec=session)
def test_qwen3_thinking_off_sessions_merge_with_repair(qwen3_like, spec):
    agents, records = play(qwen3_like, spec, thinking=False)
    builder = PrefixMergingBuilder(
        {"template_repair": ["qwen3_empty_think"], "context": "tolerant"}, tokenizer=qwen3_like
    )
    traj = builder.build(records)
    check_faithful(traj, agents, records)
    # every merged step needed the rule (the generation prompt's empty think block)
    assert traj.metadata["repaired_steps"] == sum(len(a.records) - 1 for a in agents)


@SETTINGS
@given(spec=session)
def test_qwen3_thinking_sessions_merge_with_repair(qwen3_like, spec):
    agents, records = play(qwen3_like, spec, thinking=True)
    builder = PrefixMergingBuilder(
        {"template_repair": ["drop_past_reasoning"], "context": "tolerant"}, tokenizer=qwen3_like
    )
    check_faithful(builder.build(records), agents, records)


@SETTINGS
@given(spec=session)
def test_per_request_is_one_trace_per_call(smollm2, spec):
    _, records = play(smollm2, spec)
    traj = PerRequestBuilder({"side_calls": "separate"}).build(records)
    assert len(traj.traces) == len(records)
    for trace in traj.traces:
        (cid,) = trace.metadata["completion_ids"]
        rec = next(r for r in records if r.completion_id == cid)
        assert trace.prompt_ids == rec.prompt_ids
        assert trace.response_ids == rec.sampled_ids
        assert trace.loss_mask == [1] * len(rec.sampled_ids)
        assert trace.response_logprobs == rec.logprobs
