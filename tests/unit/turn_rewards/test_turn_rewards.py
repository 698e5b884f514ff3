"""Per-turn reward hooks: what they score, where the scores land, and that exports carry them."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from polar.engines.scripted import Script, ScriptedBackend, ScriptedEngine, ScriptedReply
from polar.errors import ConfigError
from polar.harnesses.agent import run_command
from polar.schemas.task import TaskRequest, TurnRewardSpec
from polar.trajectory.exporters.registry import create_exporter
from polar.trajectory.prefix_merging import PrefixMergingBuilder
from polar.turn_rewards.base import session_turns
from polar.turn_rewards.process_reward import ProcessRewardError
from polar.turn_rewards.registry import TURN_REWARDS, create_turn_reward
from polar.turn_rewards.scoring import attach_turn_rewards, score_session

from ..trajectory.sessions import record

USER = {"role": "user", "content": "make the tests pass"}


def tool_call(call_id: str, cmd: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "run", "arguments": json.dumps({"cmd": cmd})},
            }
        ],
    }


def session():
    """A failing tool call, a passing one, then a final answer (one chain, end-of-turn 99)."""
    reply1, reply2 = tool_call("a", "pytest"), tool_call("b", "pytest -x")
    failed = {"role": "tool", "tool_call_id": "a", "content": "1 failed\nexit code 1"}
    passed = {"role": "tool", "tool_call_id": "b", "content": "3 passed"}
    c1 = record([1, 2], [10, 99], messages=[USER], response=reply1, finish="tool_calls")
    c2 = record(
        [1, 2, 10, 99, 5],
        [20, 99],
        messages=[USER, reply1, failed],
        response=reply2,
        finish="tool_calls",
    )
    c3 = record(
        [1, 2, 10, 99, 5, 20, 99, 6],
        [30, 99],
        messages=[USER, reply1, failed, reply2, passed],
        response={"role": "assistant", "content": "Done."},
    )
    return [c1, c2, c3]


def score(specs: list[TurnRewardSpec], calls, engine=None):
    hooks = [create_turn_reward(spec, engine) for spec in specs]

    async def run():
        try:
            return await score_session(hooks, calls)
        finally:
            for hook in hooks:
                await hook.aclose()

    return asyncio.run(run())


def test_turns_see_the_tool_results_that_followed():
    c1, c2, c3 = session()
    turns = session_turns([c1, c2, c3])
    assert [t.following for t in turns] == [c2, c3, None]
    assert turns[0].results == [c2.upstream_request["messages"][2]]
    assert turns[2].results == []


def test_tool_errors_scores_a_failed_tool_call_negative_and_lands_on_its_tokens():
    calls = session()
    scores = score([TurnRewardSpec(strategy="tool_errors")], calls)
    assert {cid: [s.reward for _, s in v] for cid, v in scores.items()} == {
        calls[0].completion_id: [-1.0],
        calls[1].completion_id: [0.0],
    }
    traj = PrefixMergingBuilder({"eot_token_id": 99}).build(calls)
    assert "turn_rewards" not in traj.metadata
    assert attach_turn_rewards(traj, scores) == 2
    assert traj.metadata["turn_rewards"] == traj.stats.turn_rewards == 2
    (trace,) = traj.traces
    first, second = trace.turn_rewards
    assert trace.response_ids[first.start : first.end] == calls[0].sampled_ids
    assert trace.response_ids[second.start : second.end] == calls[1].sampled_ids
    assert (first.reward, first.source, first.details["failed_tool_calls"]) == (
        -1.0,
        "tool_errors",
        ["a"],
    )


@pytest.mark.parametrize("name", ["slime", "verl", "trl", "nemo_rl", "parquet", "jsonl"])
def test_turn_rewards_reach_the_exported_rows(name, tmp_path):
    calls = session()
    traj = PrefixMergingBuilder({"eot_token_id": 99}).build(calls)
    attach_turn_rewards(traj, score([TurnRewardSpec(strategy="tool_errors")], calls))
    exporter = create_exporter(name)
    path = tmp_path / f"rows.{name}"
    exporter.write([traj], path)
    (back,) = [exporter.trace(row) for row in exporter.read(path)]
    assert back.turn_rewards == traj.traces[0].turn_rewards
    assert [t.reward for t in back.turn_rewards] == [-1.0, 0.0]


class _PRM(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer = json.dumps({"score": body["turn_index"] / 10}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def prm_url():
    server = HTTPServer(("127.0.0.1", 0), _PRM)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/score"
    server.shutdown()


def test_process_reward_model_scores_every_turn_over_http(prm_url):
    calls = session()
    spec = TurnRewardSpec(strategy="process_reward", config={"url": prm_url, "field": "score"})
    scores = score([spec], calls)
    # the server answers the scored reply's position in the conversation, over 10
    assert [scores[c.completion_id][0][1].reward for c in calls] == [0.1, 0.3, 0.5]


def test_process_reward_failure_raises_instead_of_scoring_zero():
    spec = TurnRewardSpec(strategy="process_reward", config={"url": "http://127.0.0.1:9/x"})
    with pytest.raises(ProcessRewardError, match=r"127\.0\.0\.1:9"):
        score([spec], session())


def test_llm_judge_asks_the_gateways_engine_and_scales_its_score():
    backend = ScriptedBackend(Script([ScriptedReply(content="Reasonable step. SCORE: 7")]))
    engine = ScriptedEngine(backend)
    calls = session()[:1]
    spec = TurnRewardSpec(strategy="llm_judge", config={"model": backend.model_name})
    scores = score([spec], calls, engine)
    ((name, result),) = scores[calls[0].completion_id]
    assert name == "llm_judge" and result.reward == pytest.approx(0.4)
    asked = backend.requests[-1]["messages"]
    assert "SCORE" in asked[0]["content"] and "pytest" in asked[1]["content"]


def test_llm_judge_without_an_engine_is_a_config_error():
    with pytest.raises(ConfigError, match="engine"):
        create_turn_reward(TurnRewardSpec(strategy="llm_judge"))


def test_registry_and_task_schema():
    assert {"tool_errors", "llm_judge", "process_reward"} <= set(TURN_REWARDS.names())
    task = TaskRequest.model_validate(
        {"task_id": "t", "instruction": "x", "turn_rewards": [{"strategy": "tool_errors"}]}
    )
    assert task.turn_rewards[0].strategy == "tool_errors"
    with pytest.raises(ConfigError):
        create_turn_reward(TurnRewardSpec(strategy="tool_errors", config={"bogus": 1}))


def test_a_next_call_that_rewrites_history_still_follows_the_turn():
    """A template that drops past reasoning re-renders an earlier turn differently: the next
    call diverges inside the previous prompt (a history rewrite), yet carries the tool result."""
    c1, c2, c3 = session()
    r1 = record([1, 2, 99, 3], [10, 99], messages=[USER], response=c1.response)
    r2 = record(
        [1, 2, 99, 3, 10, 99, 5],
        [20, 99],
        messages=c2.upstream_request["messages"],
        response=c2.response,
    )
    r3 = record(
        [1, 2, 99, 3, 10, 98, 5, 20, 99, 6], [30, 99], messages=c3.upstream_request["messages"]
    )
    turns = session_turns([r1, r2, r3])
    assert [t.following for t in turns] == [r2, r3, None]
    assert turns[1].results[0]["content"] == "3 passed"


@pytest.mark.parametrize(
    ("output", "failed"),
    [
        (run_command("false"), True),  # the bundled agent's own tool result: "[exit 1]"
        (run_command("ls no-such-file"), True),
        (run_command("true"), False),  # "[exit 0]"
        ("hello\n\nCommand exited with code 2", True),  # Pi's bash tool (pi-coding-agent)
        ("exit_code=1", True),
        ("exit status 3", True),
        ("Process exited with code 0", False),
        ("3 passed; the exit code was fine", False),
    ],
)
def test_tool_errors_reads_the_failure_formats_of_real_tools(output, failed):
    reply = tool_call("a", "run it")
    result = {"role": "tool", "tool_call_id": "a", "content": output}
    c1 = record([1, 2], [10, 99], messages=[USER], response=reply, finish="tool_calls")
    c2 = record([1, 2, 10, 99, 5], [30, 99], messages=[USER, reply, result])
    scores = score([TurnRewardSpec(strategy="tool_errors")], [c1, c2])
    assert [s.reward for _, s in scores[c1.completion_id]] == [-1.0 if failed else 0.0]
