"""Template-glue repair, proven on real tokenizers and chat templates.

Each case runs a session through the real template twice: without the rule it fragments (the
failure the rule exists for), with it the agent is one trace whose sampled tokens are exactly
the engine's. The Qwen3 cases use a reconstruction of Qwen3's template (see the .jinja file)
on SmolLM2's tokenizer with ``<think>`` tags added as special tokens, as Qwen3's has them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from polar.errors import ConfigError
from polar.trajectory.prefix_merging import PrefixMergingBuilder
from polar.trajectory.template_repair import (
    RepairTokens,
    TemplateRepair,
    drop_past_reasoning,
    qwen3_empty_think,
    smollm2_default_system,
)

from .sessions import TOOLS, Agent


def build(records: list[Any], tokenizer: Any, rules: list[str]) -> Any:
    return PrefixMergingBuilder(
        {"template_repair": rules, "context": "tolerant" if rules else "exact"}, tokenizer=tokenizer
    ).build(records)


def sampled_of(trace: Any) -> list[int]:
    return [t for t, m in zip(trace.response_ids, trace.loss_mask, strict=True) if m]


def all_sampled(records: list[Any]) -> list[int]:
    return [t for r in records for t in r.sampled_ids]


def qwen3_tool_session(tok: Any, *, thinking: bool) -> list[Any]:
    """Two tool-loop turns, an answer, a new user query, another tool turn and an answer."""
    agent = Agent(tok, tools=TOOLS, plain_tools=False, enable_thinking=thinking)

    def turn(content: str, reasoning: str, **kw: Any) -> None:
        prefix = f"<think>\n{reasoning}\n</think>\n\n" if thinking else ""
        agent.call(content, sampled_prefix=prefix, **kw)
        if thinking:  # the harness hands reasoning back, as vLLM's reasoning parser splits it
            agent.messages[-1]["reasoning_content"] = reasoning

    turn("Let me look.", "List the files first.", tool_cmd="ls")
    agent.tool_result("a.py b.py")
    turn("Reading it.", "Open a.py.", tool_cmd="cat a.py")
    agent.tool_result("print(1)")
    turn("The script prints 1.", "That answers it.")
    agent.user("Now add a test for it.")
    turn("Creating it.", "Write test_a.py.", tool_cmd="touch test_a.py")
    agent.tool_result("ok")
    turn("Added test_a.py.", "Done.")
    return agent.records


def test_qwen3_empty_think_block_fragments_without_the_rule(qwen3_like):
    records = qwen3_tool_session(qwen3_like, thinking=False)
    traj = build(records, qwen3_like, [])
    assert len(traj.traces) == len(records)
    assert traj.metadata["breaks"] == {"prefix_break": len(records) - 1}


def test_qwen3_empty_think_block_merges_with_the_rule(qwen3_like):
    records = qwen3_tool_session(qwen3_like, thinking=False)
    traj = build(records, qwen3_like, ["qwen3_empty_think"])
    (trace,) = traj.traces
    assert sampled_of(trace) == all_sampled(records)
    assert trace.metadata["drift_tokens"] == 0
    # each step set aside exactly the 4-token empty block of the previous generation prompt
    assert trace.metadata["repaired_steps"] == len(records) - 1
    assert trace.metadata["repaired_tokens"] == 4 * (len(records) - 1)
    # the trace shows every turn in the very context it was sampled in
    text = qwen3_like.decode(trace.prompt_ids + trace.response_ids)
    assert text.count("<think>\n\n</think>\n\n") == len(records)
    last = records[-1]
    tail = last.prompt_ids[-40:] + last.sampled_ids
    assert (trace.prompt_ids + trace.response_ids)[-len(tail) :] == tail


def test_qwen3_dropped_reasoning_fragments_without_the_rule(qwen3_like):
    records = qwen3_tool_session(qwen3_like, thinking=True)
    traj = build(records, qwen3_like, [])
    # reasoning of the tool loop is re-rendered until the new user query, then dropped
    assert [t.metadata["num_calls"] for t in traj.traces] == [3, 2]
    assert traj.metadata["breaks"] == {"prefix_break": 1}


def test_qwen3_dropped_reasoning_merges_with_the_rule(qwen3_like):
    records = qwen3_tool_session(qwen3_like, thinking=True)
    traj = build(records, qwen3_like, ["drop_past_reasoning"])
    (trace,) = traj.traces
    assert sampled_of(trace) == all_sampled(records)
    # only the step after the new user query needed the rule (the tool loop kept reasoning)
    assert trace.metadata["repaired_steps"] == 1
    # the answer before the new query lost its reasoning in the next prompt: measured drift
    assert trace.metadata["drift_turns"] == 1
    answer = records[2]
    content = qwen3_like.encode("The script prints 1.", add_special_tokens=False)
    assert trace.metadata["drift_tokens"] == len(answer.sampled_ids) - len(content) - 1


def test_smollm2_default_system_block_fragments_and_merges(smollm2):
    # no system message of its own: SmolLM2 invents one; once the harness sends tools they go
    # into a system block, and a final tool-less call brings the invented one back
    agent = Agent(smollm2, system=None)
    agent.call("I will need tools.")
    agent.user("Use them.")
    agent.tools = TOOLS
    agent.call("Listing.", tool_cmd="ls")
    agent.tool_result("a.py")
    agent.call("Reading.", tool_cmd="cat a.py")
    agent.tool_result("print(1)")
    agent.tools = None
    agent.call("It prints 1.")
    records = agent.records
    assert len(build(records, smollm2, []).traces) == 2
    traj = build(records, smollm2, ["smollm2_default_system"])
    (trace,) = traj.traces
    assert sampled_of(trace) == all_sampled(records)
    assert trace.metadata["drift_tokens"] == 0
    assert trace.prompt_ids == records[0].prompt_ids


def test_smollm2_default_block_is_read_from_the_template(smollm2):
    tokens = RepairTokens.from_tokenizer(smollm2)
    rendered = smollm2.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=True, return_dict=False
    )
    assert list(rendered[: len(tokens.default_system)]) == list(tokens.default_system)
    assert "SmolLM" in smollm2.decode(list(tokens.default_system))
    length, default = smollm2_default_system(np.asarray(rendered), tokens)
    assert (length, default) == (len(tokens.default_system), True)
    own = smollm2.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        tokenize=True,
        return_dict=False,
    )
    length, default = smollm2_default_system(np.asarray(own), tokens)
    assert default is False and smollm2.decode(own[:length]).endswith("Be brief.<|im_end|>\n")


def test_think_masks_on_real_tokens(qwen3_like):
    tokens = RepairTokens.from_tokenizer(qwen3_like)
    text = "<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n<think>\nwhy\n</think>\n\nB"
    ids = np.asarray(qwen3_like.encode(text, add_special_tokens=False))
    kept_empty = qwen3_like.decode(ids[~qwen3_empty_think(ids, tokens)].tolist())
    assert kept_empty == "<|im_start|>assistant\nA<|im_end|>\n<think>\nwhy\n</think>\n\nB"
    kept_all = qwen3_like.decode(ids[~drop_past_reasoning(ids, tokens)].tolist())
    assert kept_all == "<|im_start|>assistant\nA<|im_end|>\nB"
    unclosed = np.asarray(qwen3_like.encode("x<think>\nhmm", add_special_tokens=False))
    assert qwen3_like.decode(unclosed[~drop_past_reasoning(unclosed, tokens)].tolist()) == "x"


def test_rules_needing_think_tokens_refuse_a_tokenizer_without_them(smollm2):
    with pytest.raises(ConfigError, match="think_open"):
        TemplateRepair(["qwen3_empty_think"], RepairTokens.from_tokenizer(smollm2))
