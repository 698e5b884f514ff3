"""/metrics of both servers of a live LocalStack (rollout server, gateway node, scripted engine)
after a real task ran: a scripted agent under the ``shell`` harness makes two calls per
session, each session is graded, and its result goes to a trainer's callback receiver that is
down at first. Scraped and parsed with prometheus-client's parser, the counters equal what the
run did: tasks, sessions, dispatches, callbacks and their retries, calls, engine calls,
captured tokens (summed from the capture store) and the node's pools."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from integration.rollout_support.cluster import AGENT, CallbackReceiver, ConversationEngine
from metrics_scrape import Samples, scrape_until, total, value
from polar.client import RolloutClient
from polar.engines.registry import EngineConfig
from polar.engines.scripted import Script, ScriptedBackend
from polar.schemas.task import SessionStatus, TaskRequest
from polar.stack.local import NODE_ID, LocalStack

pytestmark = pytest.mark.slow

SAMPLES = 3
RUN_WORKERS = 2


@pytest.fixture
def stack(tmp_path: Path, tokenizer: Any) -> Iterator[LocalStack]:
    engine = ConversationEngine(ScriptedBackend(Script(), tokenizer=tokenizer))
    with LocalStack(
        engine,
        tmp_path / "polar",
        engine_config=EngineConfig(kind="scripted"),
        served_model="SmolLM2-135M-Instruct",
        runtime="local",
        run_workers=RUN_WORKERS,
    ) as running:
        yield running


def task(callback_url: str) -> TaskRequest:
    return TaskRequest.model_validate(
        {
            "task_id": "metered",
            "instruction": "Create hello.txt containing hello.",
            "num_samples": SAMPLES,
            "timeout_seconds": 60,
            "runtime": {"files": {"agent.py": AGENT}},
            "agent": {
                "harness": "shell",
                "settings": {"command": "python3 agent.py {instruction}"},
            },
            "evaluator": {"strategy": "test_on_output", "config": {"command": "test -f hello.txt"}},
            "callback_url": callback_url,
        }
    )


def test_the_counters_are_what_the_run_did(stack: LocalStack) -> None:
    receiver = CallbackReceiver()  # the trainer is not up yet: callbacks retry
    with RolloutClient(stack.rollout_url, token=stack.rollout_token) as client:
        [result] = client.run([task(receiver.url)], timeout_s=120)
    assert [r.status for r in result.results] == [SessionStatus.COMPLETED] * SAMPLES

    def retried(m: Samples) -> bool:
        return value(m, "polar_rollout_callback_retries_total") >= SAMPLES

    scrape_until(stack.rollout_url, stack.rollout_token, retried, timeout_s=30)
    receiver.start()
    try:

        def delivered(m: Samples) -> bool:
            return value(m, "polar_rollout_callbacks_total", state="delivered") == SAMPLES

        r = scrape_until(stack.rollout_url, stack.rollout_token, delivered, timeout_s=30)
    finally:
        receiver.stop()
    assert sorted(c["key"] for c in receiver.received) == sorted(
        s.session_id for s in result.results
    )
    check_rollout(r)

    def idle(m: Samples) -> bool:
        return value(m, "polar_gateway_node_sessions_finished_total", node_id=NODE_ID) == SAMPLES

    g = scrape_until(stack.gateway_url, stack.gateway_token, idle)
    records = [rec for s in result.results for rec in stack.store.records(s.session_id)]
    check_gateway(g, records)

    # Node pools as the rollout server saw them in the node's latest heartbeat: empty again.
    def drained(m: Samples) -> bool:
        return total(m, "polar_rollout_node_sessions", node_id=NODE_ID) == 0

    r = scrape_until(stack.rollout_url, stack.rollout_token, drained)
    pools = "polar_rollout_node_workers"
    assert value(r, pools, node_id=NODE_ID, pool="run") == RUN_WORKERS
    assert value(r, "polar_rollout_node_capacity", node_id=NODE_ID) > 0

    for url in (stack.rollout_url, stack.gateway_url):
        assert httpx.get(f"{url}/metrics").status_code == 401
        assert httpx.get(f"{url}/metrics", headers={"authorization": "Bearer x"}).status_code == 401


def check_rollout(r: Samples) -> None:
    assert value(r, "polar_rollout_tasks_submitted_total") == 1
    assert value(r, "polar_rollout_tasks_completed_total") == 1
    assert value(r, "polar_rollout_task_duration_seconds_count") == 1
    assert value(r, "polar_rollout_task_duration_seconds_sum") > 0
    finished = "polar_rollout_sessions_finished_total"
    assert value(r, finished, status="COMPLETED") == SAMPLES
    assert total(r, finished) == SAMPLES
    assert value(r, "polar_rollout_session_duration_seconds_count", status="COMPLETED") == SAMPLES
    # Sessions by status, read from the store: all three completed, nothing else anywhere.
    assert value(r, "polar_rollout_sessions", status="COMPLETED") == SAMPLES
    assert total(r, "polar_rollout_sessions") == SAMPLES
    # One delivered dispatch per session (and no attempt went unanswered).
    attempts = "polar_rollout_dispatch_attempts_total"
    assert value(r, attempts, outcome="delivered") == SAMPLES
    assert value(r, "polar_rollout_dispatch_duration_seconds_count") == total(r, attempts)
    assert value(r, "polar_rollout_callbacks_total", state="failed") == 0
    assert value(r, "polar_rollout_nodes", state="healthy") == 1
    assert total(r, "polar_rollout_nodes") == 1


def check_gateway(g: Samples, records: list[Any]) -> None:
    calls = len(records)
    assert calls == 2 * SAMPLES  # a tool call, then the final answer, per session
    assert (
        value(g, "polar_gateway_calls_total", provider="openai_chat", stream="false", outcome="ok")
        == calls
    )
    assert total(g, "polar_gateway_calls_total") == calls
    assert total(g, "polar_gateway_errors_total") == 0
    assert value(g, "polar_gateway_engine_duration_seconds_count") == calls
    assert value(g, "polar_gateway_capture_commit_duration_seconds_count") == calls
    prompt = sum(len(rec.prompt_ids) for rec in records)
    sampled = sum(len(rec.sampled_ids) for rec in records)
    assert value(g, "polar_gateway_prompt_tokens_total", provider="openai_chat") == prompt
    assert value(g, "polar_gateway_sampled_tokens_total", provider="openai_chat") == sampled
    assert value(g, "polar_gateway_sessions_open") == 0  # every finished session's key closed
    assert total(g, "polar_gateway_node_sessions", node_id=NODE_ID) == 0
    assert value(g, "polar_gateway_node_workers", node_id=NODE_ID, pool="run") == RUN_WORKERS
    assert value(g, "polar_gateway_node_draining", node_id=NODE_ID) == 0
