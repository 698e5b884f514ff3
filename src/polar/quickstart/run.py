"""``polar quickstart``: real rollouts end to end, in one process, on a laptop.

One command starts the engine (embedded SmolLM2 by default), a rollout server and one gateway
node on loopback ports of their own choosing, submits the bundled toy suite (each task
``samples`` times, sandboxed by bubblewrap, prefix-merged, scored by the task's check),
shows progress live, and shuts everything down on completion or Ctrl-C. What the run produced
is written to its directory (see :mod:`polar.quickstart.outputs`), summarized in a table and
drawn in a static HTML report.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil
from rich.console import Console

from polar.harnesses.registry import create_harness
from polar.logs import log_to_file
from polar.quickstart.outputs import read_captures, write_outputs
from polar.quickstart.progress import RunProgress
from polar.quickstart.report import write_report
from polar.quickstart.summary import RunSummary, summarize
from polar.quickstart.tasks import load_suite, task_request
from polar.schemas.sampling import SamplingPolicy
from polar.schemas.task import SessionResult, TaskRequest
from polar.stack.plan import runtime_spec as make_runtime_spec
from polar.stack.run import LocalRun, LocalRunOptions, RunSetup, set_up, warn

SUMMARY_JSON = "summary.json"
REPORT_HTML = "report.html"
# The servers' log events at INFO, whatever the terminal shows (docs/observability.md#logs).
LOG_JSONL = "log.jsonl"
DEFAULT_MAX_WORKERS = 16


@dataclass(frozen=True)
class QuickstartOptions(LocalRunOptions):
    """The run's size, harness, engine and output place; the defaults fit 5 minutes on 2 cores."""

    tasks: int = 3
    samples: int = 4
    max_turns: int = 6
    timeout_s: float = 180.0
    max_tokens: int | None = 128
    suite: Path | None = None
    out: Path | None = None
    workers: int | None = None
    stock_prompt: bool = False
    dashboard: bool = False

    def concurrency(self, sessions: int) -> int:
        """Sessions at once: all of a small run, so the engine decodes them as one batch."""
        return self.workers or min(sessions, DEFAULT_MAX_WORKERS)


@dataclass(frozen=True)
class QuickstartRun:
    run_dir: Path
    summary: RunSummary
    results: list[SessionResult]
    report: Path
    interrupted: bool


def default_run_dir() -> Path:
    return Path("polar-runs") / datetime.now().strftime("quickstart-%Y%m%d-%H%M%S")


def run_quickstart(options: QuickstartOptions, console: Console) -> QuickstartRun:
    """Run the suite and write the run directory; Ctrl-C ends it early but still writes it."""
    started = time.monotonic()
    suite = load_suite(options.suite)[: max(options.tasks, 1)]
    run_dir = (options.out or default_run_dir()).absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    setup = _set_up(options, len(suite) * options.samples, console)
    try:
        requests = [
            task_request(
                task,
                agent=setup.harness.agent,
                runtime=make_runtime_spec(setup.runtime, setup.harness.binds),
                num_samples=options.samples,
                timeout_s=options.timeout_s,
                run_id=run_dir.name,
            )
            for task in suite
        ]
        console.print(
            f"[bold]Polar quickstart[/]: {len(suite)} tasks × {options.samples} samples · "
            f"harness {setup.harness.name} · runtime {setup.runtime} · engine "
            f"{setup.engine.label} · model {setup.engine.served_model}"
        )
        with log_to_file(run_dir / LOG_JSONL):
            results, interrupted = _roll_out(options, setup, requests, run_dir, console)
        if not interrupted:
            setup.engine.ready()  # a model that failed to load fails the run, in its words
    finally:
        setup.engine.close()
        _reap_strays(console)
    captures = read_captures(run_dir, [r.session_id for r in results])
    write_outputs(run_dir, results, captures)
    facts = {
        "tasks": len(suite),
        "samples": options.samples,
        "harness": setup.harness.name,
        "runtime": setup.runtime,
        "engine": setup.engine.label,
        "model": setup.engine.served_model,
        "max_tokens": options.max_tokens,
        "temperature": options.temperature,
        "timeout_s": options.timeout_s,
        "max_turns": options.max_turns,
        # what makes a session several calls: the suite's follow-up messages, per session
        "user_messages": sum(1 + len(t.follow_ups) for t in suite) / len(suite),
        "run_dir": str(run_dir),
        "interrupted": interrupted,
    }
    engine_stats = setup.engine.stats()
    if engine_stats:
        facts["engine_stats"] = engine_stats
    summary = summarize(
        results,
        {sid: len(records) for sid, records in captures.items()},
        wall_s=time.monotonic() - started,
        facts=facts,
    )
    (run_dir / SUMMARY_JSON).write_text(json.dumps(summary.as_dict(), indent=2) + "\n")
    tokenizer = setup.engine.tokenizer
    report = write_report(run_dir / REPORT_HTML, summary, results, tokenizer=tokenizer)
    return QuickstartRun(run_dir, summary, results, report, interrupted)


def _set_up(options: QuickstartOptions, sessions: int, console: Console) -> RunSetup:
    """Choose the runtime, start loading the engine, make sure the harness is installed."""
    # The embedded model loads on a thread while the servers and harnesses start.
    batch = max(options.concurrency(sessions), 8)
    setup = set_up(
        options, console, batch=batch, stock_prompt=options.stock_prompt, background=True
    )
    if not options.engine_url and not create_harness(setup.harness.name).light:
        warn(
            console,
            f"{setup.harness.name}'s prompt is many thousand tokens: slow on a CPU, and over "
            "SmolLM2's 8k context for some presets; --engine-url with a larger model fits better",
        )
    setup.announce(console)
    return setup


def _roll_out(
    options: QuickstartOptions,
    setup: RunSetup,
    requests: list[TaskRequest],
    run_dir: Path,
    console: Console,
) -> tuple[list[SessionResult], bool]:
    """Start the stack, submit, watch; stop everything. Returns the results and whether the
    run was interrupted."""
    engine = setup.engine
    if options.dashboard:
        engine.ready()  # the dashboard shows token text with the model's tokenizer
    run = LocalRun(
        setup,
        run_dir,
        console,
        sampling=SamplingPolicy(temperature=options.temperature, max_tokens=options.max_tokens),
        run_workers=options.concurrency(len(requests) * options.samples),
        # Runtimes start on a free run slot (INIT inline): nothing is prepared ahead to tear
        # down on Ctrl-C, and a run slot is what a session waits for anyway.
        ready_buffer=0,
    )
    with run:
        stack = run.stack
        console.print(f"rollout server {stack.rollout_url} · gateway node {stack.gateway_url}")
        if options.dashboard:
            console.print(
                f"[bold]dashboard[/] {stack.dashboard_url} [dim](live while the run lasts)[/]",
                soft_wrap=True,
            )

        def watch(submitted: list[str]) -> bool:
            progress = RunProgress(run.client, stack.store, submitted, console)
            # No deadline of its own: each session's budget bounds its harness, and its model
            # calls (max_tokens each, at most max_turns) take what this machine needs.
            return progress.watch(math.inf, stop=engine.failed).all_done

        followed = run.follow(requests, watch, on_interrupt="cancelling the running sessions ...")
        results = [r for t in followed.submitted for r in _sorted(run.client.result(t).results)]
    return results, followed.interrupted


def _reap_strays(console: Console) -> None:
    """The last line of the promise to leave no process behind: kill any child process that
    outlived the stack (a sandbox whose runtime failed to stop it), and say so."""
    strays = psutil.Process().children(recursive=True)
    if not strays:
        return
    for proc in strays:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(strays, timeout=5)
    console.print(
        f"[yellow]warning:[/] killed {len(strays)} process(es) left behind: "
        + ", ".join(_describe(p) for p in strays[:5])
    )


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {' '.join(proc.cmdline())[:80]}"
    except psutil.Error:
        return str(proc.pid)


def _sorted(results: list[SessionResult]) -> list[SessionResult]:
    return sorted(results, key=lambda r: r.sample_index or 0)
