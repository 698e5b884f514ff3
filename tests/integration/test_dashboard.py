"""The rollout server's dashboard in a real headless Chromium, against a live LocalStack (rollout
server + gateway node + scripted engine) running tasks with the ``shell`` harness: the node shows
with its pools, the task's progress moves as sessions finish (the page follows /events), failures
show their reason, and a session opens as its trajectory, trainable tokens highlighted.

Screenshots are saved under the test's tmp dir; with ``POLAR_DASHBOARD_SCREENSHOT=<file.png>``
the live overview is also written there (docs/images/dashboard.png is made so).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from integration.browser import Chromium, find_chromium
from integration.rollout_support.cluster import AGENT, ConversationEngine
from polar.client import RolloutClient
from polar.engines.registry import EngineConfig
from polar.engines.scripted import Script, ScriptedBackend
from polar.schemas.task import TaskRequest
from polar.stack.local import LocalStack

CHROMIUM = find_chromium()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None, reason="chromium not installed (apt-get install chromium)"
    ),
]
SAMPLES = 6


def task(task_id: str, samples: int, **env: str) -> TaskRequest:
    """The scripted agent in a local runtime: a tool call that writes hello.txt, then an answer;
    graded by whether hello.txt exists."""
    return TaskRequest.model_validate(
        {
            "task_id": task_id,
            "instruction": "Create hello.txt containing hello.",
            "num_samples": samples,
            "timeout_seconds": 60,
            "runtime": {"kind": "local", "files": {"agent.py": AGENT}},
            "agent": {
                "harness": "shell",
                "settings": {"command": "python3 agent.py {instruction}"},
                "env": env,
            },
            "builder": {"strategy": "prefix_merging"},
            "evaluator": {"strategy": "test_on_output", "config": {"command": "test -f hello.txt"}},
        }
    )


@pytest.fixture
def stack(tmp_path: Path, tokenizer: Any) -> Iterator[LocalStack]:
    # Each engine call takes a moment, so sessions finish in waves the page can be seen to follow.
    engine = ConversationEngine(ScriptedBackend(Script(), tokenizer=tokenizer), latency_s=0.4)
    with LocalStack(
        engine,
        tmp_path / "stack",
        engine_config=EngineConfig(kind="scripted"),
        served_model="SmolLM2-135M-Instruct",
        run_workers=2,
        init_workers=2,
        tokenizer=tokenizer,
    ) as s:
        yield s


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Chromium]:
    assert CHROMIUM is not None
    with Chromium(CHROMIUM, tmp_path / "chromium") as b:
        yield b


def finished(browser: Chromium, task_id: str) -> int:
    return int(
        browser.evaluate(
            f"(document.querySelector(\"tr.task[data-task='{task_id}']\") || "
            "{dataset: {finished: -1}}).dataset.finished"
        )
    )


def test_the_dashboard_follows_a_live_run(
    stack: LocalStack, browser: Chromium, tmp_path: Path
) -> None:
    # The sign-in link trades the viewer token for a cookie and lands on the overview.
    browser.goto(stack.dashboard_url)
    assert browser.evaluate("location.pathname") == "/dashboard"
    assert browser.evaluate("location.search") == ""  # the token left the address bar
    browser.wait_for("document.getElementById('connection').textContent === 'live'")
    node = "tr.node[data-node='local']"
    assert browser.wait_for(f'document.querySelector("{node} .badge").textContent') == "healthy"
    pools = browser.evaluate(
        f'[...document.querySelectorAll("{node} td.pool")].map(td => td.dataset.pool)'
    )
    assert pools == ["INIT", "READY", "RUN", "POSTRUN"]

    with RolloutClient(stack.rollout_url, token=stack.rollout_token) as client:
        client.submit(task("crashes", 2, AGENT_MODE="crash"))  # dispatched first: fails early
        client.submit(task("hello", SAMPLES))
        # The page hears the submission on /events and shows the task, nothing finished yet.
        browser.wait_for("document.querySelector(\"tr.task[data-task='hello']\") !== null")
        seen = {finished(browser, "hello")}
        busy_run_pool = False
        live_shot = tmp_path / "dashboard-live.png"
        deadline = time.monotonic() + 60
        while max(seen) < SAMPLES:
            assert time.monotonic() < deadline, f"progress stuck at {sorted(seen)}"
            time.sleep(0.1)
            count = finished(browser, "hello")
            if 0 < count < SAMPLES and count not in seen:
                browser.screenshot(live_shot)  # mid-run (the latest such): the docs' picture
            seen.add(count)
            busy_run_pool = busy_run_pool or browser.evaluate(
                f"+document.querySelector(\"{node} td.pool[data-pool='RUN']\").dataset.busy > 0"
            )
        client.wait(["hello", "crashes"], timeout_s=60)

    # Progress moved through the middle, not from nothing to done in one jump.
    assert {c for c in seen if 0 < c < SAMPLES}, seen
    assert busy_run_pool  # the node's RUN pool was seen at work
    row = "tr.task[data-task='hello']"
    browser.wait_for(f"document.querySelector(\"{row}\").dataset.status === 'COMPLETED'")
    assert browser.evaluate(f'document.querySelector("{row} .progress-text").textContent') == (
        f"{SAMPLES}/{SAMPLES}"
    )
    assert "100%" in browser.evaluate(f'document.querySelector("{row}").textContent')
    # The crashing agent's sessions are failures, counted with their reason.
    crashes = browser.wait_for(
        "(r => r && r.dataset.status === 'COMPLETED' && r.textContent)"
        "(document.querySelector(\"tr.task[data-task='crashes']\"))"
    )
    assert "0%" in crashes or "error" in crashes, crashes
    events = browser.evaluate(
        "[...document.querySelectorAll('#events .kind')].map(e => e.textContent)"
    )
    assert "session_finished" in events and "task_completed" in events, events
    overview_shot = browser.screenshot(tmp_path / "dashboard.png")

    # Drill down: the task's sessions, then one session's trajectory, turn by turn.
    browser.evaluate(f'document.querySelector("{row} a").click()')
    browser.wait_for("document.querySelectorAll('a.session-link').length === 6")
    browser.evaluate("document.querySelector('a.session-link').click()")
    browser.wait_for("document.querySelector('details.session .turn .s') !== null")
    turns = browser.evaluate(
        "document.querySelectorAll('details.session .turn:not(.inter)').length"
    )
    assert turns == 2  # the tool call, then the answer: both sampled, both trainable
    sampled = browser.evaluate(
        "[...document.querySelectorAll('details.session .turn:not(.inter) .s')]"
        ".map(s => s.textContent).join('')"
    )
    assert "hello.txt" in sampled  # token text, decoded with the served model's tokenizer
    assert browser.evaluate("document.querySelectorAll('details.session .turn.inter').length") == 1
    messages = browser.evaluate("document.querySelector('details.messages').textContent")
    assert "Create hello.txt containing hello." in messages
    browser.screenshot(tmp_path / "dashboard-trajectory.png")

    # Everything the pages loaded came from the rollout server itself.
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(stack.rollout_url))
    assert browser.requests and all(u.startswith(origin) for u in browser.requests), (
        browser.requests
    )
    assert not [line for line in browser.console if line.startswith("exception")], browser.console
    for shot in (live_shot, overview_shot):
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if target := os.environ.get("POLAR_DASHBOARD_SCREENSHOT"):
        shutil.copyfile(live_shot, target)
