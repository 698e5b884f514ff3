"""Structured logs of a live run: a rollout server and a gateway node (LocalStack, the scripted
engine, the scripted agent under the ``shell`` harness) log as JSON lines; every line parses,
and each session can be followed from ``session.registered`` to its callback by its id."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from integration.rollout_support.cluster import (
    CallbackReceiver,
    ConversationEngine,
    free_port,
    shell_task,
)
from polar.client import RolloutClient
from polar.engines.registry import EngineConfig
from polar.engines.scripted import Script, ScriptedBackend
from polar.logs import IDS, configure_logging
from polar.schemas.task import TaskRequest
from polar.stack.local import NODE_ID, LocalStack

pytestmark = pytest.mark.slow

BASE_KEYS = {"ts", "level", "logger", "event", "message", *IDS}
# What the gateway node logs of one session, in this order (a READY buffer, so READY shows).
NODE_EVENTS = [
    "session.accepted",
    "session.init.start",
    "session.init.end",
    "session.ready",
    "session.run.start",
    "session.run.end",
    "session.postrun.start",
    "session.evaluated",
    "session.finished",
    "session.result_delivered",
]
# What the rollout server logs of one session, in this order.
SERVER_EVENTS = ["session.registered", "session.dispatched", "session.result", "session.callback"]


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """Every record from INFO up, as the ``polar`` command writes them with --log-format json."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    stream = io.StringIO()
    configure_logging("json", "info", stream=stream)
    yield stream
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture
def stack(tmp_path: Path, tokenizer: Any) -> Iterator[LocalStack]:
    engine = ConversationEngine(ScriptedBackend(Script(), tokenizer=tokenizer))
    with LocalStack(
        engine,
        tmp_path / "stack",
        engine_config=EngineConfig(kind="scripted"),
        served_model="SmolLM2-135M-Instruct",
        runtime="local",
        run_workers=2,
    ) as running:
        yield running


def run_tasks(stack: LocalStack, receiver: CallbackReceiver, *tasks: dict[str, Any]) -> None:
    with RolloutClient(stack.rollout_url, token=stack.rollout_token) as client:
        for task in tasks:
            client.submit(TaskRequest.model_validate(task))
        client.wait([task["task_id"] for task in tasks], timeout_s=60)
    # The callbacks are delivered after the results are stored: wait for them too.
    expected = sum(task["num_samples"] for task in tasks)
    deadline = time.monotonic() + 30
    while len(receiver.received) < expected and time.monotonic() < deadline:
        time.sleep(0.05)


def parse(stream: io.StringIO) -> list[dict[str, Any]]:
    lines = stream.getvalue().splitlines()
    assert lines, "nothing was logged"
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    for record in records:
        assert isinstance(record, dict) and set(record) >= BASE_KEYS, record
    return records


def local_task(task_id: str, receiver: CallbackReceiver, **options: Any) -> dict[str, Any]:
    task = shell_task(task_id, receiver, **options)
    task["runtime"]["kind"] = "local"
    return task


def test_one_session_followed_by_its_id(
    stack: LocalStack, json_log: io.StringIO, tmp_path: Path
) -> None:
    receiver = CallbackReceiver()
    receiver.start()
    try:
        run_tasks(stack, receiver, local_task("hello", receiver, num_samples=3))
    finally:
        receiver.stop()
    records = parse(json_log)

    by_session: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record["session_id"]:
            by_session.setdefault(record["session_id"], []).append(record)
    assert len(by_session) == 3
    for session_id, lines in by_session.items():
        events = [r["event"] for r in lines]
        node = [r["event"] for r in lines if r["logger"].startswith("polar.gateway")]
        server = [r["event"] for r in lines if r["logger"].startswith("polar.rollout")]
        assert node == NODE_EVENTS, session_id
        assert server == SERVER_EVENTS, session_id
        # What one side logs before it answers the other comes first in the merged log.
        for before, after in (
            ("session.registered", "session.accepted"),
            ("session.accepted", "session.dispatched"),
            ("session.finished", "session.result"),
            ("session.result", "session.result_delivered"),
        ):
            assert events.index(before) < events.index(after), (before, after, events)
        assert all(r["task_id"] == "hello" for r in lines)
        assert all(r["node_id"] == NODE_ID for r in lines if r["event"] != "session.registered")
        assert [r["ts"] for r in lines] == sorted(r["ts"] for r in lines)
        assert all(r["level"] == "INFO" and "error" not in r for r in lines)
        last = {r["event"]: r for r in lines}
        assert last["session.init.end"]["outcome"] == "ok"
        assert last["session.run.end"]["outcome"] == "ok"
        assert last["session.run.end"]["seconds"] >= 0
        assert last["session.evaluated"]["reward"] == 1.0
        assert last["session.evaluated"]["passed"] is True
        assert last["session.finished"]["status"] == "COMPLETED"
        assert last["session.finished"]["reward"] == 1.0
        assert last["session.result"]["status"] == "COMPLETED"
        assert last["session.callback"]["state"] == "delivered"

    tasks = [r for r in records if r["event"] in ("task.submitted", "task.completed")]
    assert [r["event"] for r in tasks] == ["task.submitted", "task.completed"]
    assert tasks[0]["num_samples"] == 3 and tasks[0]["task_id"] == "hello"
    results = [i for i, r in enumerate(records) if r["event"] == "session.result"]
    assert records.index(tasks[1]) > max(results)

    # The docs' jq line follows one session through the same log.
    if shutil.which("jq") is None:
        return
    log_file = tmp_path / "log.jsonl"
    log_file.write_text(json_log.getvalue())
    session_id = next(iter(by_session))
    followed = subprocess.run(
        ["jq", "-r", "--arg", "s", session_id, "select(.session_id == $s) | .event", str(log_file)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert followed.stdout.split() == [r["event"] for r in by_session[session_id]]


def test_a_failed_session_logs_its_error_with_its_ids(
    stack: LocalStack, json_log: io.StringIO
) -> None:
    receiver = CallbackReceiver()
    receiver.start()
    try:
        run_tasks(
            stack,
            receiver,
            local_task("crash", receiver, num_samples=1, agent_env={"AGENT_MODE": "crash"}),
        )
    finally:
        receiver.stop()
    records = parse(json_log)
    failures = [r for r in records if r.get("error")]
    events = {r["event"] for r in failures}
    assert {"session.run.end", "session.finished", "session.result"} <= events, events
    [session_id] = {r["session_id"] for r in failures if r["event"] == "session.result"}
    for record in failures:
        if record["event"].startswith("session."):
            assert record["session_id"] == session_id
            assert record["task_id"] == "crash"
    run_end = next(r for r in failures if r["event"] == "session.run.end")
    assert run_end["outcome"] == "error" and run_end["node_id"] == NODE_ID
    assert "7" in run_end["error"]  # the agent's exit status
    finished = next(r for r in failures if r["event"] == "session.finished")
    assert finished["status"] == "ERROR"


def test_serve_rollout_logs_json_lines_at_info(tmp_path: Path) -> None:
    """The command as an operator runs it: ``--log-format json`` after the command, and the
    server's default level (info) shows a submitted task's events on stderr."""
    port = free_port()
    env = {**os.environ, "POLAR_LOG_FORMAT": "text"}  # the flag wins over the environment
    command = ["serve-rollout", "--port", str(port), "--data-dir", str(tmp_path / "rollout")]
    server = subprocess.Popen(
        [sys.executable, "-m", "polar.cli.main", *command, "--log-format", "json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and server.poll() is None, "server did not start"
                time.sleep(0.1)
        token = (tmp_path / "rollout" / "rollout.token").read_text().strip()
        headers = {"authorization": f"Bearer {token}"}
        task = local_task("queued", CallbackReceiver(), num_samples=2)
        del task["callback_url"]
        reply = httpx.post(f"{url}/tasks", json=task, headers=headers, timeout=10)
        assert reply.status_code == 201, reply.text
    finally:
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=30)
    records = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    events = [r["event"] for r in records]
    assert "task.submitted" in events
    registered = [r for r in records if r["event"] == "session.registered"]
    assert len(registered) == 2 and {r["task_id"] for r in registered} == {"queued"}
    assert token not in stderr
