"""The NeMo Gym agent's converter (integrations/nemo_gym/.../convert.py), without nemo_gym.

Traces come from Polar's real prefix_merging builder; the records handed to Gym must pass
NeMo RL's and Gym's contiguity checks, carry exactly the captured ids and logprobs of each
call, and end the token chain where a merged context stops being the engine's prompt.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from integration.rollout_support.cluster import AGENT, ConversationEngine
from polar.capture.records import CaptureRecord
from polar.engines.registry import EngineConfig
from polar.engines.scripted import Script, ScriptedBackend
from polar.schemas.ids import is_valid_id
from polar.schemas.task import TaskRequest
from polar.stack.local import LocalStack
from polar.trajectory.prefix_merging import PrefixMergingBuilder
from unit.trajectory.sessions import record

from .gym_convert import gym_contiguity, load, nemo_rl_walk

conv = load()
EOT = 99
DRIFTED = 7  # what a drifted re-rendering puts where the sampled reply began

# One call: sampled ids (before the end-of-turn), the glue after its re-rendered reply,
# how many tool calls it makes, and whether the next prompt re-renders it differently.
CALL = st.tuples(
    st.lists(st.integers(100, 500), min_size=1, max_size=6),
    st.lists(st.integers(50, 60), min_size=1, max_size=4),
    st.integers(0, 2),
    st.booleans(),
)


def session_records(spec: list[tuple[list[int], list[int], int, bool]]) -> list[CaptureRecord]:
    """Captured calls of one harness conversation: each prompt is the previous prompt, the
    engine's re-rendering of the previous reply, then the tool results' glue."""
    context = [1, 2, 3]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "do it"}]
    records = []
    for k, (sampled, glue, n_tools, drift) in enumerate(spec):
        calls = [
            {
                "id": f"call_{k}_{j}",
                "type": "function",
                "function": {"name": "run", "arguments": json.dumps({"n": j})},
            }
            for j in range(n_tools)
        ]
        reply: dict[str, Any] = {"role": "assistant", "content": f"reply {k}" if k % 2 else None}
        if calls:
            reply["tool_calls"] = calls
        ids = [*sampled, EOT]
        records.append(record(list(context), ids, messages=list(messages), response=reply))
        rendered = [DRIFTED, *ids[1:]] if drift else ids
        context = context + rendered + glue
        results = [
            {"role": "tool", "tool_call_id": c["id"], "content": f"out {c['id']}"} for c in calls
        ]
        messages = [*messages, reply, *results]
    return records


def session_result(records: list[CaptureRecord], context: str = "exact", **fields: Any) -> dict:
    trajectory = PrefixMergingBuilder({"eot_token_id": EOT, "context": context}).build(records)
    return {
        "session_id": "sess-1",
        "task_id": "task-1",
        "status": "COMPLETED",
        "reward": 1.0,
        "trajectory": trajectory.model_dump(mode="json"),
        **fields,
    }


def record_of(result: dict) -> dict:
    return conv.gym_record(result, response_id="resp_1", model="polar", created_at=0)


def token_items(record: dict) -> list[dict]:
    return [i for i in record["response"]["output"] if "generation_token_ids" in i]


def call_index(item: dict) -> int | None:
    """Which call an item belongs to, from its id (msg_k, rs_k, fc_k_j); None for outputs."""
    return int(item["id"].split("_")[1]) if item.get("id") else None


@settings(max_examples=150, deadline=None)
@given(st.lists(CALL, min_size=1, max_size=5), st.sampled_from(["exact", "tolerant"]))
def test_records_are_contiguous_exact_and_one_token_item_per_call(spec, context) -> None:
    records = session_records(spec)
    by_id = {r.completion_id: r for r in records}
    result = session_result(records, context)
    gym = record_of(result)
    trace = conv.main_trace(result["trajectory"]["traces"])
    ids = trace["metadata"]["completion_ids"]

    nemo_rl_walk(gym)  # raises on what NeMo RL would reject
    gym_contiguity(gym["response"])

    chained = token_items(gym)
    # The gate: every prompt handed on is the engine's own prompt for that call, exactly.
    for item, completion_id in zip(chained, ids, strict=False):
        captured = by_id[completion_id]
        assert item["prompt_token_ids"] == captured.prompt_ids
        assert item["generation_token_ids"] == captured.sampled_ids
        assert item["generation_log_probs"] == captured.logprobs
    inexact = set(trace["metadata"]["inexact_context_calls"])
    expected = next((k for k, c in enumerate(ids) if c in inexact), len(ids))
    assert len(chained) == expected == gym["polar_token_calls"]
    assert gym["polar_left_out_calls"] == len(ids) - expected
    assert gym["polar_chain_end"] == ("inexact_context" if expected < len(ids) else None)
    if context == "exact":
        assert not inexact and len(chained) == len(ids)
    assert gym["polar_left_out_traces"] == len(result["trajectory"]["traces"]) - 1
    assert gym["mask_sample"] is False and gym["reward"] == 1.0

    # Token fields sit on the last item of their call, and only there.
    output = gym["response"]["output"]
    for i, item in enumerate(output):
        if "generation_token_ids" in item:
            k = call_index(item)
            after = output[i + 1] if i + 1 < len(output) else None
            assert after is None or call_index(after) != k
    assert [call_index(i) for i in chained] == list(range(len(chained)))
    # Every tool result answers a call made before it.
    made: set[str] = set()
    for item in output:
        if item["type"] == "function_call":
            made.add(item["call_id"])
        elif item["type"] == "function_call_output":
            assert item["call_id"] in made
    assert gym["polar_items_aligned"] is True


def test_drift_ends_the_chain_at_the_first_inexact_call() -> None:
    r1 = record([1, 2], [10, 11, 12, 99])
    r2 = record([1, 2, 10, 77, 12, 99, 5], [20, 99])  # the engine saw 77, not the sampled 11
    r3 = record([1, 2, 10, 77, 12, 99, 5, 20, 99, 6], [30, 99])
    gym = record_of(session_result([r1, r2, r3], "tolerant"))
    (only,) = token_items(gym)
    assert only["prompt_token_ids"] == r1.prompt_ids
    assert only["generation_token_ids"] == r1.sampled_ids
    assert gym["polar_token_calls"] == 1 and gym["polar_left_out_calls"] == 2
    # The later replies stay (a verifier reads the final answer) but carry no tokens.
    texts = [i["content"][0]["text"] for i in gym["response"]["output"] if i["type"] == "message"]
    assert len(texts) == 3


def test_usage_counts_the_prompt_and_the_chained_sampled_tokens() -> None:
    records = session_records([([100, 101], [50], 1, False), ([102], [51], 0, False)])
    gym = record_of(session_result(records))
    usage = gym["response"]["usage"]
    assert usage["input_tokens"] == 3
    assert usage["output_tokens"] == sum(len(r.sampled_ids) for r in records)


# -- failures -----------------------------------------------------------------------------

TWO_CALLS = [([100, 101], [50], 1, False), ([102], [51], 0, False)]


@pytest.mark.parametrize(
    ("fields", "mask", "kind", "reward"),
    [
        ({}, False, None, 1.0),
        (
            {"status": "TIMEOUT", "failure": {"kind": "timeout", "reason": "budget"}},
            False,
            "agent_timeout",
            1.0,
        ),
        ({"status": "TIMEOUT"}, False, "agent_timeout", 1.0),
        (
            {"status": "ERROR", "reward": None, "failure": {"kind": "agent", "reason": "exit 7"}},
            True,
            "agent_run_error",
            0.0,
        ),
        (
            {"status": "ERROR", "reward": None, "error": "harness exited 7"},
            True,
            "agent_run_error",
            0.0,
        ),
        (
            {"status": "ERROR", "reward": None, "failure": {"kind": "evaluator", "reason": "x"}},
            True,
            "verifier_error",
            0.0,
        ),
        (
            {
                "status": "ERROR",
                "reward": None,
                "failure": {"kind": "infra", "reason": "node lost"},
            },
            True,
            "provider_unavailable",
            0.0,
        ),
        (
            {
                "status": "ERROR",
                "reward": None,
                "failure": {"kind": "infra", "reason": "cancelled"},
            },
            True,
            "cancelled",
            0.0,
        ),
        (
            {"status": "ERROR", "reward": None, "failure": {"kind": "quota", "reason": "?"}},
            True,
            "polar:quota",
            0.0,
        ),
        ({"reward": None}, True, "verifier_error", 0.0),
    ],
)
def test_failure_mapping(fields: dict, mask: bool, kind: str | None, reward: float) -> None:
    result = session_result(session_records(TWO_CALLS), **fields)
    gym = record_of(result)
    assert (gym["mask_sample"], gym["failure_kind"], gym["reward"]) == (mask, kind, reward)
    assert len(token_items(gym)) == 2  # failed sessions keep their tokens (masked, not lost)
    reason = (fields.get("failure") or {}).get("reason") or fields.get("error")
    if reason:
        assert reason in gym["failure_reason"]
    nemo_rl_walk(gym)


def test_a_session_without_a_trace_is_masked_with_one_empty_message() -> None:
    result = {
        "session_id": "s",
        "task_id": "t",
        "status": "TIMEOUT",
        "failure": {"kind": "timeout", "reason": "no call in 1 s"},
        "trajectory": None,
    }
    gym = record_of(result)
    assert gym["mask_sample"] is True and gym["failure_kind"] == "agent_timeout"
    assert [i["type"] for i in gym["response"]["output"]] == ["message"]
    assert not token_items(gym)
    assert "no call in 1 s" in gym["failure_reason"]


def test_untrainable_and_logprob_less_traces_are_masked() -> None:
    aborted = [record([1, 2], [10, 99], finish="abort")]
    gym = record_of(session_result(aborted))
    assert gym["mask_sample"] is True and "aborted" in gym["failure_reason"]
    no_logprobs = [record([1, 2], [10, 99], logprobs=None)]
    gym = record_of(session_result(no_logprobs))
    assert gym["mask_sample"] is True and not token_items(gym)
    assert gym["polar_chain_end"] == "no_logprobs"


def test_gym_verified_records_need_no_polar_reward() -> None:
    result = session_result(session_records(TWO_CALLS), reward=None)
    gym = conv.gym_record(result, response_id="r", model="m", created_at=0, polar_reward=False)
    assert gym["mask_sample"] is False and gym["failure_kind"] is None


# -- rows -> TaskRequest ------------------------------------------------------------------

TEMPLATE = {
    "timeout_seconds": 60,
    "runtime": {"kind": "bubblewrap", "files": {"a.py": "A"}},
    "agent": {"harness": "pi"},
    "evaluator": {"strategy": "test_on_output", "config": {"command": "pytest", "timeout": 5}},
}


def test_row_becomes_a_valid_task_request_with_the_row_laid_over_the_template() -> None:
    row = {
        "responses_create_params": {"input": "Fix the bug.", "tools": [{"type": "function"}]},
        "polar_task": {
            "runtime": {"files": {"b.py": "B"}},
            "evaluator": {"config": {"command": "pytest -x"}},
        },
        "_ng_task_index": 3,
        "_ng_rollout_index": 1,
        "policy_version": 7,
    }
    task = conv.task_request(
        row, TEMPLATE, task_id="gym-n-3-1", callback_url="http://127.0.0.1:9/cb"
    )
    parsed = TaskRequest.model_validate(task)
    assert parsed.instruction == "Fix the bug." and parsed.num_samples == 1
    assert parsed.runtime.kind == "bubblewrap"
    assert parsed.runtime.files == {"a.py": "A", "b.py": "B"}
    assert parsed.evaluator.config == {"command": "pytest -x", "timeout": 5}
    assert parsed.metadata == {
        "group_id": "gym-task-3",
        "gym_rollout_id": "3-1",
        "policy_version": 7,
    }
    assert parsed.callback_url == "http://127.0.0.1:9/cb"
    assert TEMPLATE["runtime"]["files"] == {"a.py": "A"}  # the template is not mutated


@pytest.mark.parametrize(
    ("input_", "expected"),
    [
        ("plain", "plain"),
        ([{"role": "user", "content": "hi"}], "hi"),
        (
            [
                {
                    "role": "user",
                    "type": "message",
                    "content": [
                        {"type": "input_text", "text": "a"},
                        {"type": "input_text", "text": "b"},
                    ],
                }
            ],
            "ab",
        ),
        (
            [
                {"role": "developer", "content": "rules"},
                {"role": "user", "content": "task"},
                {"role": "assistant", "content": "ignored"},
                {"type": "function_call_output", "call_id": "x", "output": "ignored"},
            ],
            "rules\n\ntask",
        ),
    ],
)
def test_instruction_from_input(input_: Any, expected: str) -> None:
    assert conv.instruction_from_input(input_) == expected


def test_polar_task_instruction_wins_and_an_empty_row_is_refused() -> None:
    row = {"responses_create_params": {"input": "x"}, "polar_task": {"instruction": "y"}}
    assert conv.task_request(row, {}, task_id="t", callback_url=None)["instruction"] == "y"
    with pytest.raises(conv.RowError, match="no instruction"):
        conv.task_request(
            {"responses_create_params": {"input": []}}, {}, task_id="t", callback_url=None
        )


def test_rollout_key_follows_gyms_rule() -> None:
    assert conv.rollout_key({"_ng_task_index": 2, "_ng_rollout_index": 5}) == "2-5"
    assert (
        conv.rollout_key({"_ng_task_index": 2, "_ng_rollout_index": 5, "_ng_attempt_index": 0})
        == "2-5"
    )
    assert (
        conv.rollout_key({"_ng_task_index": 2, "_ng_rollout_index": 5, "_ng_attempt_index": 2})
        == "2-5-a2"
    )
    assert conv.rollout_key({"_ng_rollout_id": "r.x", "_ng_attempt_index": 1}) == "r.x-a1"
    assert conv.rollout_key({}) is None


@given(st.text(min_size=1, max_size=300), st.text(min_size=1, max_size=300))
def test_task_ids_are_valid_deterministic_and_distinct(a: str, b: str) -> None:
    first = conv.task_id_for("ab12", a)
    assert is_valid_id(first) and first == conv.task_id_for("ab12", a)
    assert (first == conv.task_id_for("ab12", b)) == (a == b)
    assert conv.task_id_for("cd34", a) != first


# -- against real captures ----------------------------------------------------------------


@pytest.fixture
def stack(tmp_path: Path, tokenizer: Any) -> Iterator[LocalStack]:
    engine = ConversationEngine(ScriptedBackend(Script(), tokenizer=tokenizer))
    with LocalStack(
        engine,
        tmp_path / "stack",
        engine_config=EngineConfig(kind="scripted"),
        served_model="SmolLM2-135M-Instruct",
        runtime="local",
        run_workers=1,
        init_workers=1,
    ) as s:
        yield s


def test_token_fields_equal_the_capture_store_records(stack: LocalStack) -> None:
    """The scripted agent asks for a tool call, runs it, then answers: two captured calls in
    one merged trace; Gym's items carry exactly the store's ids and logprobs."""
    template = {
        "timeout_seconds": 30,
        "runtime": {"kind": "local", "files": {"agent.py": AGENT}},
        "agent": {"harness": "shell", "settings": {"command": "python3 agent.py {instruction}"}},
        "builder": {"strategy": "prefix_merging"},
        "evaluator": {"strategy": "test_on_output", "config": {"command": "test -f hello.txt"}},
    }
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": "Create hello.txt."}]},
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
    }
    task_id = conv.task_id_for("unit", conv.rollout_key(row))
    task = conv.task_request(row, template, task_id=task_id, callback_url=None)
    headers = {"authorization": f"Bearer {stack.rollout_token}"}
    reply = httpx.post(f"{stack.rollout_url}/tasks", json=task, headers=headers, timeout=10)
    assert reply.status_code == 201, reply.text
    deadline = time.monotonic() + 60
    while (body := httpx.get(f"{stack.rollout_url}/tasks/{task_id}", headers=headers).json())[
        "status"
    ] != "COMPLETED":
        assert time.monotonic() < deadline, body
        time.sleep(0.1)
    (result,) = body["results"]
    assert result["status"] == "COMPLETED", result.get("error")

    gym = record_of(result)
    records = stack.store.records(result["session_id"])
    items = token_items(gym)
    assert len(records) == len(items) == 2
    for item, captured in zip(items, records, strict=True):
        assert item["prompt_token_ids"] == captured.prompt_ids
        assert item["generation_token_ids"] == captured.sampled_ids
        assert item["generation_log_probs"] == captured.logprobs
    nemo_rl_walk(gym)
    assert gym["reward"] == 1.0 and gym["mask_sample"] is False
    kinds = [i["type"] for i in gym["response"]["output"]]
    assert kinds == ["function_call", "function_call_output", "message"]
    call, output, answer = gym["response"]["output"]
    assert call["name"] == "run" and json.loads(call["arguments"]) == {
        "command": "echo hello > hello.txt"
    }
    assert output["call_id"] == call["call_id"] and output["output"] == ""
    assert answer["content"][0]["text"] == "Created hello.txt."
