"""Polar as a NeMo Gym environment, end to end: real Gym 0.7.0 (``ng_run`` +
``ng_collect_rollouts``) drives the polar_agent server, which runs each rollout as one session
on a live Polar stack. Two stacks, one Gym: a scripted engine with SmolLM2's tokenizer under
the scripted tool-using agent, and the embedded engine (the random ``tiny`` model with
SmolLM2's tokenizer; ``POLAR_EMBEDDED_MODEL=smollm2`` for the real one) under a two-call
agent. Every token-bearing item must equal the capture store's record for its call; rewards
come from Polar's evaluator, or from Gym's string_match verifier; a crashing harness is masked,
a timed-out one keeps its partial trace, and a ``/run`` that outwaits ``wait_timeout_s``
cancels its session through ``DELETE /tasks/{id}``.

Skips (saying why) without Python 3.13 or when nemo-gym cannot be installed. The first run
installs the Gym venv (~4 min, cached under Polar's cache dir); then ~2 min.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from integration.gym_kit import (
    AGENT_CONFIG,
    SEARCH_ROOT,
    Unavailable,
    clean_env,
    free_port,
    gym_venv,
    ray_head,
    run_in_gym,
    server_venvs,
    start_group,
)
from integration.rollout_support.cluster import AGENT, ConversationEngine
from polar.engines.embedded import EmbeddedEngineCore, load_model
from polar.engines.registry import EngineConfig
from polar.engines.scripted import Script, ScriptedBackend
from polar.gateway.config import SamplingPolicy
from polar.stack.local import LocalStack

pytestmark = [pytest.mark.slow, pytest.mark.nemo_gym]

REPEATS = 2
ANSWER = "Created hello.txt."  # the scripted engine's final reply
TEMPLATE = {
    "timeout_seconds": 30,
    "runtime": {"kind": "local", "files": {"agent.py": AGENT}},
    "agent": {"harness": "shell", "settings": {"command": "python3 agent.py {instruction}"}},
    "builder": {"strategy": "prefix_merging"},
    "evaluator": {"strategy": "test_on_output", "config": {"command": "test -f hello.txt"}},
}


# Two model calls whatever the model says; the second reply is the answer.
TWO_CALL_AGENT = """\
import json, os, sys, urllib.request

def complete(messages):
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": "polar", "messages": messages}).encode(),
        headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.load(reply)["choices"][0]["message"].get("content") or ""

messages = [{"role": "user", "content": sys.argv[1]}]
messages += [{"role": "assistant", "content": complete(messages)},
             {"role": "user", "content": "Now say it in other words."}]
open("answer.txt", "w", newline="").write(complete(messages))
"""
# A grade that depends on what the model sampled: pass on an even-length answer.
# newline="" keeps a sampled "\r\n" as two characters, as the test's own len() counts it.
EVEN_LENGTH = "python3 -c \"import sys; sys.exit(len(open('answer.txt', newline='').read()) % 2)\""
EMBEDDED_TEMPLATE = {
    "timeout_seconds": 120,
    "runtime": {"kind": "local", "files": {"agent.py": TWO_CALL_AGENT}},
    "agent": {"harness": "shell", "settings": {"command": "python3 agent.py {instruction}"}},
    "builder": {"strategy": "prefix_merging"},
    "evaluator": {"strategy": "test_on_output", "config": {"command": EVEN_LENGTH}},
}
IMPATIENT_WAIT_S = 4  # the /run gives up long before the session's own 60 s budget


def row(agent: str, text: str, **fields: Any) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": text}]},
        "agent_ref": {"type": "responses_api_agents", "name": agent},
        **fields,
    }


ROWS = [
    row("polar_agent", "Create hello.txt."),
    row("polar_agent", "Create hello.txt, please.", polar_task={"metadata": {"kind": "second"}}),
    row("polar_agent_verified", "Create hello.txt.", expected_answer=ANSWER,
        extraction_mode="full_response"),
    row("polar_agent_verified", "Create hello.txt.", expected_answer="Goodbye.",
        extraction_mode="full_response"),
    row("polar_agent", "Crash.", polar_task={"agent": {"env": {"AGENT_MODE": "crash"}}}),
    row("polar_agent", "Hang.", polar_task={"timeout_seconds": 3,
                                            "agent": {"env": {"AGENT_MODE": "hang"}}}),
    row("polar_agent_embedded", "Name a colour."),
    row("polar_agent_embedded", "Count to three."),
    row("polar_agent_impatient", "Hang.", polar_task={"timeout_seconds": 60,
                                                      "agent": {"env": {"AGENT_MODE": "hang"}}}),
]  # fmt: skip


@dataclass
class Collected:
    records: list[dict[str, Any]]
    out: Path
    stack: LocalStack
    embedded: LocalStack
    venv: Path

    def of(self, agent: str, task_index: int) -> list[dict[str, Any]]:
        found = [
            r
            for r in self.records
            if r["agent_ref"]["name"] == agent and r["_ng_task_index"] == task_index
        ]
        assert len(found) == REPEATS, [r["agent_ref"] for r in self.records]
        return found


@pytest.fixture(scope="module")
def venv() -> Path:
    try:
        return gym_venv()
    except Unavailable as exc:
        print(f"nemo_gym: skipped: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Iterator[LocalStack]:
    engine = ConversationEngine(ScriptedBackend(Script(), tokenizer=tokenizer))
    with LocalStack(
        engine,
        tmp_path_factory.mktemp("polar"),
        engine_config=EngineConfig(kind="scripted"),
        served_model="SmolLM2-135M-Instruct",
        runtime="local",
        run_workers=2,
        loop="asyncio",  # two stacks in this process start harnesses at once
    ) as s:
        yield s


@pytest.fixture(scope="module")
def embedded_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    core = EmbeddedEngineCore(load_model(os.environ.get("POLAR_EMBEDDED_MODEL", "tiny")))
    try:
        with LocalStack.embedded(
            core,
            tmp_path_factory.mktemp("polar-embedded"),
            sampling=SamplingPolicy(max_tokens=12),
            runtime="local",
            run_workers=4,
            loop="asyncio",
        ) as s:
            yield s
    finally:
        core.close()


def polar_config(stack: LocalStack, template: dict[str, Any], **more: Any) -> dict[str, Any]:
    config = {
        "entrypoint": "app.py",
        "polar_url": stack.rollout_url,
        "polar_token": stack.rollout_token,
        "poll_interval_s": 0.5,
        "task_template": template,
    }
    return {"responses_api_agents": {"polar_agent": config | more}}


def overlay(stack: LocalStack, embedded: LocalStack) -> dict[str, Any]:
    """Our test's additions to the shipped agent config: where Polar is, the scripted task, a
    second agent graded by Gym's string_match, one on the embedded stack, and an impatient
    one that cancels."""
    return {
        "polar_agent": polar_config(stack, TEMPLATE),
        "polar_agent_verified": polar_config(
            stack,
            TEMPLATE,
            reward_source="resources_server",
            resources_server={"type": "resources_servers", "name": "string_match"},
        ),
        "polar_agent_embedded": polar_config(embedded, EMBEDDED_TEMPLATE),
        "polar_agent_impatient": polar_config(
            stack, TEMPLATE, wait_timeout_s=IMPATIENT_WAIT_S, cancel_wait_s=30
        ),
        "string_match": {
            "resources_servers": {"string_match": {"entrypoint": "app.py", "domain": "knowledge"}}
        },
    }


@pytest.fixture(scope="module")
def collected(
    venv: Path,
    stack: LocalStack,
    embedded_stack: LocalStack,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Collected]:
    work = tmp_path_factory.mktemp("gym")
    (work / "overlay.yaml").write_text(yaml.safe_dump(overlay(stack, embedded_stack)))
    (work / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    venvs = server_venvs(venv, work / "venvs")
    head_port = free_port()
    env = clean_env(NEMO_GYM_EXTRA_ROOTS=str(SEARCH_ROOT))
    with ray_head(venv) as ray_address:
        servers = start_group(
            [str(venv / "bin/ng_run"), f"+config_paths=[{AGENT_CONFIG},{work / 'overlay.yaml'}]",
             f"+uv_venv_dir={venvs}", "+skip_venv_if_present=true",
             f"+ray_head_node_address={ray_address}", f"+head_server.port={head_port}"],
            work / "ng_run.log", work, env,
        )  # fmt: skip
        try:
            servers.wait_for("servers ready", timeout_s=180)
            collect = start_group(
                [str(venv / "bin/ng_collect_rollouts"), f"+input_jsonl_fpath={work / 'rows.jsonl'}",
                 f"+output_jsonl_fpath={work / 'out.jsonl'}", f"+num_repeats={REPEATS}",
                 f"+head_server.port={head_port}"],
                work / "collect.log", work, env,
            )  # fmt: skip
            try:
                assert collect.process.wait(timeout=300) == 0, collect.text()[-3000:]
            finally:
                collect.stop()
        finally:
            servers.stop()
    out = work / "out.jsonl"
    records = [json.loads(line) for line in out.read_text().splitlines()]
    yield Collected(records, out, stack, embedded_stack, venv)


def token_items(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for i in record["response"]["output"] if "generation_token_ids" in i]


def assert_exact(stack: LocalStack, record: dict[str, Any], calls: int) -> None:
    """The record's token-bearing items are exactly the session's captured calls."""
    captured = stack.store.records(record["polar_session_id"])
    items = token_items(record)
    assert len(items) == len(captured) == calls
    for item, call in zip(items, captured, strict=True):
        assert item["prompt_token_ids"] == call.prompt_ids
        assert item["generation_token_ids"] == call.sampled_ids
        assert item["generation_log_probs"] == call.logprobs


def test_every_rollout_came_back(collected: Collected) -> None:
    assert len(collected.records) == len(ROWS) * REPEATS
    sessions = {r["polar_session_id"] for r in collected.records}
    assert len(sessions) == len(ROWS) * REPEATS  # one Polar session per Gym rollout


def test_polar_rewarded_rollouts_carry_the_exact_captured_tokens(collected: Collected) -> None:
    for task_index in (0, 1):
        for record in collected.of("polar_agent", task_index):
            assert record["reward"] == 1.0 and record["mask_sample"] is False
            assert record["failure_kind"] is None and record["polar_status"] == "COMPLETED"
            assert_exact(collected.stack, record, calls=2)
            kinds = [i["type"] for i in record["response"]["output"]]
            assert kinds == ["function_call", "function_call_output", "message"]
            assert record["response"]["output"][-1]["content"][0]["text"] == ANSWER


def test_a_gym_verifier_grades_the_final_answer(collected: Collected) -> None:
    right = collected.of("polar_agent_verified", 2)
    wrong = collected.of("polar_agent_verified", 3)
    for record in right + wrong:
        assert record["polar_reward"] == 1.0  # Polar's evaluator is kept beside it
        assert record["extracted_answer"] == ANSWER  # the verifier's own fields pass through
        assert record["mask_sample"] is False
        assert_exact(collected.stack, record, calls=2)
    assert [r["reward"] for r in right] == [1.0] * REPEATS
    assert [r["reward"] for r in wrong] == [0.0] * REPEATS


def test_a_crashed_harness_is_masked_and_a_timeout_keeps_its_partial_trace(
    collected: Collected,
) -> None:
    for record in collected.of("polar_agent", 4):
        assert record["polar_status"] == "ERROR"
        assert record["mask_sample"] is True and record["failure_kind"] == "agent_run_error"
        assert record["reward"] == 0.0
        assert_exact(collected.stack, record, calls=1)  # the tokens sampled before the crash
    for record in collected.of("polar_agent", 5):
        assert record["polar_status"] == "TIMEOUT"
        assert record["mask_sample"] is False and record["failure_kind"] == "agent_timeout"
        assert record["reward"] == 0.0  # the evaluator ran: no hello.txt
        assert_exact(collected.stack, record, calls=1)


def polar_result(stack: LocalStack, record: dict[str, Any]) -> dict[str, Any]:
    """The rollout server's own result for the record's session."""
    task_id = record["response"]["metadata"]["polar_task_id"]
    reply = httpx.get(
        f"{stack.rollout_url}/tasks/{task_id}",
        headers={"authorization": f"Bearer {stack.rollout_token}"},
        timeout=30,
    )
    reply.raise_for_status()
    [result] = reply.json()["results"]
    assert result["session_id"] == record["polar_session_id"]
    return dict(result)


def test_the_embedded_engines_tokens_come_back_exactly(collected: Collected) -> None:
    for task_index in (6, 7):
        for record in collected.of("polar_agent_embedded", task_index):
            assert record["polar_status"] == "COMPLETED" and record["failure_kind"] is None
            assert record["mask_sample"] is False and record["polar_chain_end"] is None
            assert_exact(collected.embedded, record, calls=2)  # both calls, one chain
            for call in collected.embedded.store.records(record["polar_session_id"]):
                assert call.engine == "embedded" and 0 < len(call.sampled_ids) <= 12
            # The reward is Polar's evaluator's, and that graded what the model wrote.
            answer = record["response"]["output"][-1]["content"][0]["text"]
            assert record["reward"] == polar_result(collected.embedded, record)["reward"]
            assert record["reward"] == float(len(answer) % 2 == 0)


def test_a_run_that_outwaits_wait_timeout_cancels_its_session(collected: Collected) -> None:
    for record in collected.of("polar_agent_impatient", 8):
        result = polar_result(collected.stack, record)
        assert result["status"] == "ERROR"
        assert result["failure"] == {"kind": "infra", "reason": "cancelled"}
        assert record["polar_status"] == "ERROR" and record["mask_sample"] is True
        assert record["failure_kind"] == "cancelled" and record["reward"] == 0.0
        # What it sampled before the cancel, if its harness got that far on a busy machine.
        captured = collected.stack.store.records(record["polar_session_id"])
        assert len(captured) <= 1
        assert_exact(collected.stack, record, calls=len(captured))


GYM_CHECKS = """
import json, sys
from nemo_gym.token_id_capture.builder import assert_prefix_contiguity
from nemo_gym.token_id_capture.delivery import rollout_carries_token_ids
count = 0
for line in open(sys.argv[1]):
    record = json.loads(line)
    assert_prefix_contiguity(record["response"])
    # Gym sees tokens exactly where we handed some on (a cancel may come before any call).
    assert rollout_carries_token_ids(record) == (record["polar_token_calls"] > 0)
    count += 1
print(count)
"""


def test_gyms_own_checks_pass_and_metrics_are_aggregated(collected: Collected) -> None:
    checked = run_in_gym(collected.venv, GYM_CHECKS, str(collected.out))
    assert int(checked) == len(ROWS) * REPEATS
    metrics = json.loads(collected.out.with_name("out_aggregate_metrics.json").read_text())
    flat = json.dumps(metrics)
    assert "mean/reward" in flat and "polar_token_calls" in flat
