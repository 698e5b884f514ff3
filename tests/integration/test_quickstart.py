"""``polar quickstart`` end to end at its smallest size, with the tiny test model.

The run is real: rollout server, gateway node and embedded engine on loopback, the bundled
agent (and Pi, where installed) in bubblewrap, trajectories built and checked. The tests hold
the run directory to what the issue promises: schema-valid trajectories, a logprob for every
trainable token (the engine's own, as captured), a summary that matches the files, and no
process left behind.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from statistics import fmean
from typing import Any

import psutil
import pyarrow.parquet as pq
import pytest

from polar.capture.records import CaptureRecord
from polar.cli import quickstart as quickstart_cli
from polar.errors import ConfigError, HarnessError
from polar.harnesses.bundled import AGENT_PATH
from polar.harnesses.install import default_prefix, installed_names
from polar.harnesses.registry import CLI_PRESETS
from polar.quickstart.tasks import load_suite, task_request
from polar.schemas.task import AgentSpec, RuntimeSpec, SessionResult, SessionStatus, TaskRequest
from polar.schemas.trajectory import Trace
from polar.stack import plan

FILES = (
    "results.jsonl",
    "trajectories.jsonl",
    "trajectories.parquet",
    "captures.db",
    "captures.jsonl",
    "summary.json",
    "report.html",
)


def run_cli(*args: str) -> int:
    parser = argparse.ArgumentParser(prog="polar")
    quickstart_cli.add_parser(parser.add_subparsers())
    parsed = parser.parse_args(["quickstart", *args])
    return int(parsed.func(parsed))


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def leftovers(run_dir: Path) -> list[str]:
    """Processes this run started that are still alive: the test's descendants, any process
    whose command line names the run directory (sandboxes), and any process carrying one of
    the run's session ids in its environment (harnesses, whose own command line may not say,
    as Pi renames itself ``pi``)."""
    me = psutil.Process()
    session_ids = {r["session_id"] for r in lines(run_dir / "results.jsonl")}
    found = {p.pid: p for p in me.children(recursive=True)}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid == me.pid:
            continue
        try:
            ours = str(run_dir) in " ".join(proc.info["cmdline"] or []) or (
                proc.environ().get("POLAR_SESSION_ID") in session_ids
            )
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if ours:
            found[proc.pid] = proc
    alive = []
    for proc in found.values():
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{proc.pid} {' '.join(proc.cmdline())[:200]}")
        except psutil.NoSuchProcess:
            continue
    return alive


def assert_no_leftovers(run_dir: Path) -> None:
    deadline = time.monotonic() + 10
    while (alive := leftovers(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive == []


def assert_run_dir(run_dir: Path, *, sessions: int, tasks: int) -> None:
    for name in FILES:
        assert (run_dir / name).is_file(), name
    results = [SessionResult.model_validate(r) for r in lines(run_dir / "results.jsonl")]
    assert len(results) == sessions
    assert all(r.status.finished for r in results)
    captures = [CaptureRecord.model_validate(r) for r in lines(run_dir / "captures.jsonl")]
    rows = lines(run_dir / "trajectories.jsonl")
    traces = [
        Trace.model_validate({k: v for k, v in row.items() if k != "session"}) for row in rows
    ]
    assert traces == [t for r in results if r.trajectory for t in r.trajectory.traces]
    assert pq.read_table(run_dir / "trajectories.parquet").num_rows == len(traces)

    # Every trainable token is exactly a sampled token, with the logprob the engine returned.
    by_session: dict[str, list[CaptureRecord]] = {}
    for record in captures:
        by_session.setdefault(record.session_id, []).append(record)
    for result in results:
        assert (run_dir / "sessions" / result.session_id / "session.log").is_file()
        if result.trajectory is None:
            continue
        sampled = [t for rec in by_session.get(result.session_id, []) for t in rec.sampled_ids]
        engine_lps = [
            lp for rec in by_session.get(result.session_id, []) for lp in rec.logprobs or []
        ]
        trainable: list[int] = []
        trainable_lps: list[float] = []
        for trace in result.trajectory.traces:
            assert trace.response_logprobs is not None, "a trainable token lacks its logprob"
            for token, mask, lp in zip(
                trace.response_ids, trace.loss_mask, trace.response_logprobs, strict=True
            ):
                if mask:
                    assert math.isfinite(lp) and lp <= 0.0
                    trainable.append(token)
                    trainable_lps.append(lp)
        assert trainable == sampled
        assert trainable_lps == engine_lps
        # The checker saw the agent's last reply, as captured.
        last = by_session[result.session_id][-1].response.get("content") or ""
        assert result.evaluation is not None
        assert result.evaluation.details["final_answer"] == last[-500:]

    # The summary's numbers are the files' numbers.
    summary = json.loads((run_dir / "summary.json").read_text())
    total = summary["total"]
    assert total["sessions"] == len(results)
    assert total["calls"] == len(captures)
    assert total["traces"] == len(traces) == len(rows)
    for status, key in (
        (SessionStatus.COMPLETED, "completed"),
        (SessionStatus.TIMEOUT, "timeout"),
        (SessionStatus.ERROR, "error"),
    ):
        assert total[key] == sum(1 for r in results if r.status == status)
    assert total["trainable_tokens"] == sum(sum(t.loss_mask) for t in traces)
    assert len(summary["tasks"]) == tasks
    for task_id, counts in summary["tasks"].items():
        rewards = [r.reward for r in results if r.task_id == task_id and r.reward is not None]
        assert counts["mean_reward"] == (fmean(rewards) if rewards else None)
        assert counts["sessions"] == sum(1 for r in results if r.task_id == task_id)
    assert summary["wall_s"] > 0

    report = (run_dir / "report.html").read_text()
    assert "Polar quickstart report" in report
    for asset in ("<script", "<link", "<img", " src=", "url("):  # self-contained, no network
        assert asset not in report
    assert all(href.startswith("#") for href in re.findall(r"href='([^']*)'", report))
    assert all(f"id='s-{r.session_id}'" in report for r in results)


def assert_merged_conversations(summary: dict[str, Any], *, sessions: int) -> None:
    """The default suite's first tasks are three-message conversations: each session's calls
    merge into one trace (more than two calls per trace) and every merged call's context is
    exactly the tokens the engine saw."""
    total = summary["total"]
    assert total["completed"] == sessions
    assert total["traces"] == sessions and total["breaks"] == 0
    assert total["merge_ratio"] > 2
    assert total["merged_calls"] >= 2 * sessions
    assert total["context_exact_calls"] == total["merged_calls"]
    assert summary["facts"]["user_messages"] == 3


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) not installed")
def test_smallest_quickstart_with_the_bundled_agent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    code = run_cli(
        "--model", "tiny", "--harness", "agent", "--tasks", "2", "--samples", "2",
        "--max-tokens", "24", "--timeout", "60", "--out", str(run_dir),
    )  # fmt: skip
    assert code == 0
    assert_run_dir(run_dir, sessions=4, tasks=2)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["facts"]["runtime"] == "bubblewrap"
    assert summary["facts"]["harness"] == "agent"
    assert summary["total"]["calls"] >= 4  # every session asked the model at least once
    assert_merged_conversations(summary, sessions=4)
    assert_no_leftovers(run_dir)
    assert "left behind" not in capsys.readouterr().out  # the runtimes stopped everything


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) not installed")
def test_smallest_quickstart_with_pi(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if "pi" not in installed_names(default_prefix()):
        pytest.skip("Pi is not installed (polar harness install pi)")
    run_dir = tmp_path / "run"
    code = run_cli(
        "--model", "tiny", "--tasks", "1", "--samples", "2", "--max-tokens", "24",
        "--timeout", "90", "--out", str(run_dir),
    )  # fmt: skip
    assert code == 0
    assert_run_dir(run_dir, sessions=2, tasks=1)
    records = lines(run_dir / "captures.jsonl")
    assert {r["provider"] for r in records} == {"openai_chat"}
    assert all(r["upstream_request"]["messages"][0]["role"] == "system" for r in records)
    assert_merged_conversations(json.loads((run_dir / "summary.json").read_text()), sessions=2)
    assert_no_leftovers(run_dir)
    assert "left behind" not in capsys.readouterr().out


_CLI = """
import argparse, sys
from polar.cli import quickstart
parser = argparse.ArgumentParser(prog="polar")
quickstart.add_parser(parser.add_subparsers())
args = parser.parse_args(["quickstart", *sys.argv[1:]])
sys.exit(args.func(args))
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) not installed")
def test_ctrl_c_stops_everything_and_still_writes_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLI, "--model", "tiny", "--harness", "agent", "--tasks", "1",
         "--samples", "2", "--max-tokens", "4000", "--timeout", "300", "--out", str(run_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not any("agent.py" in cmdline for cmdline in _descendant_cmdlines(proc.pid)):
            assert proc.poll() is None and time.monotonic() < deadline, "no harness started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    results = [SessionResult.model_validate(r) for r in lines(run_dir / "results.jsonl")]
    assert len(results) == 2
    assert all(r.status == SessionStatus.ERROR and r.error == "cancelled" for r in results)
    assert json.loads((run_dir / "summary.json").read_text())["facts"]["interrupted"] is True
    assert (run_dir / "report.html").is_file()
    assert_no_leftovers(run_dir)


# What a library's warning looks like on the screen: ``FutureWarning: ...`` from the warnings
# module, or a library logger's deprecation notice.
_LIBRARY_WARNING = re.compile(r".*\b\w+Warning: .*|.*\bdeprecated\b.*")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) not installed")
def test_the_default_quickstart_completes_every_session_on_busy_cores(tmp_path: Path) -> None:
    """``polar quickstart`` as a newcomer types it (SmolLM2, Pi, 12 sessions), with a busy
    loop on every core besides whatever else the machine runs: every session completes (a
    busy machine makes the run slower, never a session TIMEOUT), and the screen shows Polar's
    output only, no library's warning."""
    run_dir = tmp_path / "run"
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(len(os.sched_getaffinity(0)))
    ]
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CLI, "--out", str(run_dir)],
            capture_output=True, text=True, timeout=1800, check=False,
        )  # fmt: skip
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    total = summary["total"]
    assert (total["sessions"], total["completed"]) == (12, 12), output[-3000:]
    assert summary["facts"]["harness"] == ("pi" if shutil.which("npm") else "agent")
    assert _LIBRARY_WARNING.findall(output) == []
    assert_no_leftovers(run_dir)


def _descendant_cmdlines(pid: int) -> list[str]:
    cmdlines = []
    try:
        for child in psutil.Process(pid).children(recursive=True):
            cmdlines.append(" ".join(child.cmdline()))
    except psutil.NoSuchProcess:
        pass
    return cmdlines


# -- the bundled suite and agent, without a model ------------------------------------------


@pytest.mark.parametrize("task", load_suite(), ids=lambda t: t.id)
def test_each_check_passes_on_its_solution_and_fails_untouched(task: Any, tmp_path: Path) -> None:
    for rel, content in task.files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(content)

    def check(answer: str) -> int:
        env = {**os.environ, "FINAL_ANSWER": answer}
        done = subprocess.run(
            ["bash", "-c", task.check], cwd=tmp_path, env=env, capture_output=True
        )
        return done.returncode

    assert check("") != 0
    assert task.solution or task.answer
    if task.solution:
        subprocess.run(["bash", "-c", task.solution], cwd=tmp_path, check=True)
    assert check(task.answer or "") == 0


def test_question_checks_judge_the_answer_not_its_surroundings() -> None:
    tasks = {t.id: t for t in load_suite()}

    def passes(task_id: str, answer: str) -> bool:
        env = {**os.environ, "FINAL_ANSWER": answer}
        done = subprocess.run(["bash", "-c", tasks[task_id].check], env=env, capture_output=True)
        return done.returncode == 0

    assert passes("add-numbers", "9 - 1 = 8")
    assert not passes("add-numbers", "9 - 1 is 8 + 1, so 9")
    assert passes("capital", "The capital of Spain is Madrid.")
    assert not passes("capital", "Barcelona")


class _ScriptedModel(BaseHTTPRequestHandler):
    """Chat completions: an action first (a shell tool call, or a fenced bash block when
    ``fenced``), a plain answer once the action's output is in the conversation."""

    requests: list[dict[str, Any]] = []
    fenced = False

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        type(self).requests.append({"auth": self.headers["authorization"], "body": body})
        command = "echo hello > hello.txt && echo wrote"
        if len(body["messages"]) > 2:
            message: dict[str, Any] = {"role": "assistant", "content": "Done."}
        elif self.fenced:
            message = {"role": "assistant", "content": f"Sure:\n```bash\n{command}\n```\n"}
        else:
            arguments = json.dumps({"command": command})
            call = {
                "id": "c1",
                "type": "function",
                "function": {"name": "shell", "arguments": arguments},
            }
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        payload = json.dumps({"choices": [{"index": 0, "message": message}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def scripted_model() -> Iterator[str]:
    _ScriptedModel.requests = []
    _ScriptedModel.fenced = False
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ScriptedModel)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_bundled_agent_runs_tool_calls_and_stops_on_an_answer(
    scripted_model: str, tmp_path: Path
) -> None:
    env = {**os.environ, "OPENAI_BASE_URL": scripted_model, "OPENAI_API_KEY": "ps-key"}
    done = subprocess.run(
        [sys.executable, str(AGENT_PATH), "--max-turns", "3", "Create hello.txt"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "hello.txt").read_text() == "hello\n"
    assert done.stdout.strip().endswith("Done.")
    first, second = _ScriptedModel.requests
    assert first["auth"] == "Bearer ps-key"
    assert [t["function"]["name"] for t in first["body"]["tools"]] == ["shell"]
    assert second["body"]["messages"][-1] == {
        "role": "tool", "tool_call_id": "c1", "content": "wrote\n[exit 0]",
    }  # fmt: skip


def test_bundled_agent_runs_a_fenced_bash_block_when_there_is_no_tool_call(
    scripted_model: str, tmp_path: Path
) -> None:
    _ScriptedModel.fenced = True
    env = {**os.environ, "OPENAI_BASE_URL": scripted_model, "OPENAI_API_KEY": "k"}
    done = subprocess.run(
        [sys.executable, str(AGENT_PATH), "Create hello.txt"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "hello.txt").read_text() == "hello\n"
    _, second = _ScriptedModel.requests
    assert second["body"]["messages"][-2]["content"].startswith("Sure:")
    assert second["body"]["messages"][-1] == {
        "role": "user", "content": "Output of your command:\nwrote\n[exit 0]",
    }  # fmt: skip


def test_bundled_agent_sends_follow_ups_in_the_same_conversation(
    scripted_model: str, tmp_path: Path
) -> None:
    env = {**os.environ, "OPENAI_BASE_URL": scripted_model, "OPENAI_API_KEY": "k"}
    done = subprocess.run(
        [sys.executable, str(AGENT_PATH), "--max-turns", "6", "Create hello.txt", "And now?",
         "Last one."],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # a tool call and its answer, then one answer per follow-up, each extending the last
    bodies = [r["body"]["messages"] for r in _ScriptedModel.requests]
    assert len(bodies) == 4
    assert all(later[: len(earlier)] == earlier for earlier, later in itertools.pairwise(bodies))
    assert [m["content"] for m in bodies[-1] if m["role"] == "user"] == [
        "Create hello.txt", "And now?", "Last one.",
    ]  # fmt: skip
    assert bodies[-1][-2] == {"role": "assistant", "content": "Done."}


def test_follow_ups_go_to_pi_or_the_bundled_agent_and_are_refused_elsewhere() -> None:
    task = next(t for t in load_suite() if t.follow_ups)
    runtime = RuntimeSpec(kind="local")

    def request(agent: AgentSpec) -> TaskRequest:
        return task_request(
            task, agent=agent, runtime=runtime, num_samples=1, timeout_s=9, run_id="r"
        )

    pi = request(AgentSpec(harness="pi", settings={"tools": ["bash"]})).agent
    assert pi.settings == {"tools": ["bash"], "follow_ups": task.follow_ups}
    bundled = request(plan.agent_plan(4, "m").agent).agent
    assert bundled.settings == {"max_turns": 4, "follow_ups": task.follow_ups}
    with pytest.raises(ConfigError, match="follow_ups"):
        request(AgentSpec(harness="qwen_code"))


def test_bundled_agent_stops_at_max_turns(scripted_model: str, tmp_path: Path) -> None:
    env = {**os.environ, "OPENAI_BASE_URL": scripted_model, "OPENAI_API_KEY": "k"}
    done = subprocess.run(
        [sys.executable, str(AGENT_PATH), "--max-turns", "1", "Create hello.txt"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0
    assert len(_ScriptedModel.requests) == 1
    assert "stopped after 1 turns" in done.stdout


# -- graceful fallbacks ----------------------------------------------------------------------


def test_pi_without_npm_falls_back_to_the_bundled_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLAR_HARNESS_PREFIX", str(tmp_path / "empty-prefix"))
    real_which = shutil.which
    monkeypatch.setattr(
        plan.shutil, "which", lambda name: None if name == "npm" else real_which(name)
    )
    chosen = plan.choose_harness(
        "pi", max_turns=3, model_name="m", stock_prompt=False, echo=lambda line: None
    )
    assert chosen.name == "agent" and chosen.warnings
    assert chosen.agent.harness == "agent"
    assert chosen.agent.settings == {"max_turns": 3}
    assert chosen.binds == []
    with pytest.raises(HarnessError, match="npm"):
        plan.choose_harness(
            "opencode", max_turns=3, model_name="m", stock_prompt=False, echo=lambda line: None
        )


def test_turn_limits_come_from_the_cli_or_else_from_the_gateway(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plan, "installed_names", lambda prefix: set(CLI_PRESETS))

    def chosen(name: str) -> AgentSpec:
        return plan.choose_harness(
            name, max_turns=5, model_name="m", stock_prompt=False, echo=lambda line: None
        ).agent

    pi, qwen = chosen("pi"), chosen("qwen_code")
    assert pi.max_model_calls == 5 and "max_turns" not in pi.settings
    assert qwen.settings["max_turns"] == 5 and qwen.max_model_calls is None


def test_without_bubblewrap_sessions_run_as_local_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert plan.bubblewrap_problem("no-such-bwrap") == "no-such-bwrap not found"
    monkeypatch.setattr(plan, "bubblewrap_problem", lambda: "bwrap not found")
    warnings: list[str] = []
    assert plan.choose_runtime(None, warnings.append) == "local"
    assert "bwrap not found" in warnings[0]
    assert plan.choose_runtime("bubblewrap", warnings.append) == "bubblewrap"
    assert len(warnings) == 1
