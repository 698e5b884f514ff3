"""``polar generate``: offline SFT data generation with an acceptance filter.

A model (the embedded engine, or a vLLM/SGLang server) runs a harness over SWE-style
instances, each ``attempts`` times, in sandboxes on this machine (a rollout server and one
gateway node on loopback, as ``polar quickstart`` runs them). The ``swe_tests`` evaluator grades
every attempt by the instance's tests; the attempts it resolves, whose trajectories completed,
become the dataset. The output directory::

    DIR/
      attempts.jsonl          the ledger: one line per finished attempt (resume key:
                              instance_id, attempt), appended and fsynced as each finishes
      trajectories/<instance>/<attempt>.json   each attempt's SessionResult (trajectory,
                              evaluation with the model's patch)
      dataset.jsonl           accepted attempts as SFT rows (messages + tools, input_ids +
                              assistant_masks), rebuilt from the ledger every run
      dataset.parquet         the same rows, typed (with pyarrow)
      acceptance.json / .md   attempts, accepted and rate per repository and overall, with
                              session time and tokens
      runs/<n>/               each run's servers' state: captures.db, rollout/, sessions/ (logs;
                              workspaces are deleted once recorded), run.json

Running the same command again resumes: only attempts missing from the ledger are submitted.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from polar.errors import ConfigError
from polar.generation.acceptance import AcceptanceReport, acceptance, write_acceptance
from polar.generation.attempts import (
    AttemptRecord,
    Ledger,
    instance_slug,
    missing_attempts,
    read_ledger,
)
from polar.generation.collect import Collector, TaskPlan
from polar.generation.dataset import DatasetFiles, write_dataset
from polar.generation.options import GenerateOptions
from polar.generation.progress import GenerateView
from polar.runtimes.registry import binds_host_paths
from polar.schemas.sampling import SamplingPolicy
from polar.schemas.task import TaskRequest
from polar.stack.demonstrator import demonstrator_engine
from polar.stack.plan import EngineHandle
from polar.stack.run import LocalRun, RunSetup, closing_engine, set_up
from polar.swe.instances import SWEInstance, load_instances
from polar.swe.tasks import SWETaskOptions, instance_task

RUNS = "runs"
RUN_JSON = "run.json"
REPOS = "repos"
POLL_S = 0.5
# Beyond each wave's session budget: the evaluation (a fresh runtime, the tests), start-up.
_EVAL_ALLOWANCE = 2.0
_DEADLINE_SLACK_S = 300.0


@dataclass(frozen=True)
class GenerateRun:
    """What a run left in its directory, and what this invocation itself did."""

    out_dir: Path
    report: AcceptanceReport
    dataset: DatasetFiles
    acceptance_json: Path
    acceptance_md: Path
    ledger: Path
    run: int | None
    """This invocation's run number; None when the ledger already held every attempt."""
    submitted: int
    recorded: list[AttemptRecord]
    interrupted: bool


def run_generate(
    options: GenerateOptions, console: Console, engine: EngineHandle | None = None
) -> GenerateRun:
    """Run the attempts the ledger lacks, then rebuild the dataset and the acceptance report.

    ``engine`` serves the run when given (the caller keeps and closes it); otherwise the
    options' engine is opened and closed here. Ctrl-C stops the run early, keeping every
    attempt that finished, and still writes the outputs.
    """
    out = options.out.absolute()
    out.mkdir(parents=True, exist_ok=True)
    instances = select_instances(_load(options), options.only, options.limit)
    ledger = Ledger(out)
    earlier = read_ledger(ledger.path)
    todo = missing_attempts(
        [i.instance_id for i in instances],
        options.attempts,
        earlier,
        retry_errors=options.retry_errors,
    )
    repos = {i.repo for i in instances}
    console.print(
        f"[bold]polar generate[/]: {len(instances)} instances ({len(repos)} repos) × "
        f"{options.attempts} attempts from {options.source}: "
        f"{sum(map(len, todo.values()))} to run, {len(earlier)} in the ledger already"
    )
    run = None
    submitted = 0
    recorded: list[AttemptRecord] = []
    interrupted = False
    if todo:
        run = next_run(out)
        chosen = [i for i in instances if i.instance_id in todo]
        submitted = sum(map(len, todo.values()))
        # What the view counts as earlier: the ledger less the attempts run again now.
        kept = [r for r in earlier.values() if r.attempt not in todo.get(r.instance_id, ())]
        recorded, interrupted = _generate(options, console, engine, ledger, run, chosen, todo, kept)
    records = list(read_ledger(ledger.path).values())
    dataset = write_dataset(out, records, ledger.load_result)
    report = acceptance(records, _facts(out, options, dataset))
    acceptance_json, acceptance_md = write_acceptance(out, report)
    return GenerateRun(
        out_dir=out,
        report=report,
        dataset=dataset,
        acceptance_json=acceptance_json,
        acceptance_md=acceptance_md,
        ledger=ledger.path,
        run=run,
        submitted=submitted,
        recorded=recorded,
        interrupted=interrupted,
    )


def select_instances(
    instances: list[SWEInstance], only: tuple[str, ...], limit: int | None
) -> list[SWEInstance]:
    """``only`` (instance ids, in the file's order), then the first ``limit``; an id that is
    not there is an error, since a typo would otherwise run nothing."""
    seen: dict[str, SWEInstance] = {}
    for instance in instances:
        seen.setdefault(instance.instance_id, instance)
    chosen = list(seen.values())
    if only:
        absent = [i for i in only if i not in seen]
        if absent:
            raise ConfigError(f"no such instance: {', '.join(absent)}")
        wanted = set(only)
        chosen = [i for i in chosen if i.instance_id in wanted]
    return chosen[:limit] if limit is not None else chosen


def next_run(out: Path) -> int:
    """The number of this run: one more than the runs already in ``out``."""
    numbers = [int(p.name) for p in (out / RUNS).glob("*") if p.name.isdigit()]
    return max(numbers, default=0) + 1


def run_task_id(instance_id: str, run: int) -> str:
    """A task id unique to this run (a rerun's tasks must not collide with earlier ones)."""
    return f"{instance_slug(instance_id)}-r{run}"


def _load(options: GenerateOptions) -> list[SWEInstance]:
    if options.bundled:
        from polar.swe.bundled import bundled_instances

        return bundled_instances()
    if not options.instances:
        raise ConfigError("give an instance file (or dataset), or --bundled")
    return load_instances(options.instances, split=options.split)


def _generate(
    options: GenerateOptions,
    console: Console,
    engine: EngineHandle | None,
    ledger: Ledger,
    run: int,
    instances: list[SWEInstance],
    todo: dict[str, list[int]],
    earlier: list[AttemptRecord],
) -> tuple[list[AttemptRecord], bool]:
    """Run the missing attempts as run number ``run``; the records it added, and whether it
    was interrupted."""
    started = time.time()
    run_dir = ledger.out_dir / RUNS / f"{run:03d}"
    run_dir.mkdir(parents=True, exist_ok=True)
    setup = _set_up(options, console, engine, instances)
    models = {str(r.get("model")) for r in _runs(ledger.out_dir)}
    if models and str(setup.engine.served_model) not in models:
        console.print(
            f"[yellow]warning:[/] {ledger.out_dir} holds attempts by {', '.join(sorted(models))}; "
            f"its dataset will mix them with {setup.engine.served_model}'s"
        )
    with closing_engine(setup):
        plans, requests = _tasks(options, setup, ledger.out_dir, run, instances, todo)
        console.print(
            f"run {run}: harness {setup.harness.name} · runtime {setup.runtime} · engine "
            f"{setup.engine.label} · model {setup.engine.served_model} · "
            f"{options.concurrency} at once"
        )
        collector = Collector(ledger, plans, run=run, keep_workspaces=options.keep_workspaces)
        view = GenerateView(collector, earlier)
        interrupted = _roll_out(options, setup, run_dir, collector, view, requests, console)
        if not console.is_terminal:
            console.print(view.render())
    facts = {
        "run": run,
        "started_at": started,
        "wall_s": round(time.time() - started, 1),
        "submitted": sum(len(p.attempts) for p in plans),
        "recorded": len(collector.records),
        "interrupted": interrupted,
        "engine": setup.engine.label,
        "model": setup.engine.served_model,
        "harness": setup.harness.name,
        "runtime": setup.runtime,
        "concurrency": options.concurrency,
        "timeout_s": options.timeout_s,
        "max_turns": options.max_turns,
        "temperature": options.temperature,
    }
    (run_dir / RUN_JSON).write_text(json.dumps(facts, indent=2) + "\n")
    return collector.records, interrupted


def _set_up(
    options: GenerateOptions,
    console: Console,
    engine: EngineHandle | None,
    instances: list[SWEInstance],
) -> RunSetup:
    """Choose the runtime, open the engine (unless given), install the harness."""
    owns = engine is None
    if engine is None and options.demonstrator:
        engine = demonstrator_engine(instances, options.harness)
    setup = set_up(
        options,
        console,
        batch=max(options.concurrency, 8),
        stock_prompt=not options.compact_prompt,
        engine=engine,
        owns_engine=owns,
    )
    setup.announce(console)
    return setup


def _tasks(
    options: GenerateOptions,
    setup: RunSetup,
    out: Path,
    run: int,
    instances: list[SWEInstance],
    todo: dict[str, list[int]],
) -> tuple[list[TaskPlan], list[TaskRequest]]:
    """One task per instance, one session per missing attempt."""
    task_options = dict(options.task_options)
    if options.bundled:
        from polar.swe.bundled import bundle_repos

        bundles = bundle_repos(out / REPOS)
        task_options.setdefault("repos", {repo: str(path) for repo, path in bundles.items()})
    agent = setup.harness.agent
    binds = setup.harness.binds if binds_host_paths(setup.runtime) else []
    swe_options = SWETaskOptions(
        runtime=setup.runtime,
        harness=agent.harness or agent.import_path or "shell",
        model_name=agent.model_name,
        settings=agent.settings,
        agent_env=agent.env,
        timeout_s=options.timeout_s,
        **{**task_options, "ro_binds": [*task_options.get("ro_binds", []), *binds]},
    )
    plans: list[TaskPlan] = []
    requests: list[TaskRequest] = []
    for instance in instances:
        attempts = todo[instance.instance_id]
        task_id = run_task_id(instance.instance_id, run)
        task = instance_task(instance, swe_options, task_id=task_id)
        requests.append(
            task.model_copy(
                update={
                    "num_samples": len(attempts),
                    "metadata": {**task.metadata, "attempts": attempts, "generate_run": run},
                }
            )
        )
        plans.append(TaskPlan(task_id, instance.instance_id, instance.repo, attempts))
    return plans, requests


def _roll_out(
    options: GenerateOptions,
    setup: RunSetup,
    run_dir: Path,
    collector: Collector,
    view: GenerateView,
    requests: list[TaskRequest],
    console: Console,
) -> bool:
    """Start the stack, submit, record attempts as they finish; stop everything. Returns
    whether the run was interrupted."""
    embedded = setup.engine.config.kind == "embedded"
    run = LocalRun(
        setup,
        run_dir,
        console,
        sampling=SamplingPolicy(
            temperature=options.temperature, max_tokens=options.output_cap(embedded=embedded)
        ),
        run_workers=options.concurrency,
        # Each evaluation runs the instance's tests in a fresh runtime: one per run slot keeps
        # the graders from falling behind the agents.
        postrun_workers=options.concurrency,
        # One prepared workspace per run slot: checkouts and image copies (INIT) happen while
        # other attempts run, off the run path; a session's budget pauses while it waits READY.
        ready_buffer=options.concurrency,
    )
    with run:
        collector.connect(run.client, run.stack.store)
        if not console.is_terminal:
            collector.on_record = lambda record: console.print(view.line(record), markup=False)
        deadline = _deadline_s(options, list(collector.plans.values()))
        # Unfinished sessions are cancelled as the run winds down; they are not recorded, so
        # they run again.
        followed = run.follow(
            requests,
            lambda _: _watch(collector, view, console, deadline),
            on_interrupt="keeping finished attempts, stopping ...",
            after_interrupt=collector.poll,
        )
    return followed.interrupted


def _watch(collector: Collector, view: GenerateView, console: Console, deadline_s: float) -> bool:
    """Poll until every attempt is recorded or the deadline passes; whether all were."""
    end = time.monotonic() + deadline_s
    with _live(view, console) as update:
        while True:
            collector.poll()
            update()
            if collector.done:
                return True
            if time.monotonic() > end:
                return False
            time.sleep(POLL_S)


@contextlib.contextmanager
def _live(view: GenerateView, console: Console) -> Iterator[Any]:
    """A redraw function: the live table on a terminal, nothing in a log."""
    if not console.is_terminal:
        yield lambda: None
        return
    with Live(view.render(), console=console, refresh_per_second=4) as live:
        yield lambda: live.update(view.render())


def _deadline_s(options: GenerateOptions, plans: list[TaskPlan]) -> float:
    """A bound on the whole run: every wave of sessions spending its budget and its
    evaluation, plus slack; each session's own timeout ends it well before."""
    sessions = sum(len(p.attempts) for p in plans)
    waves = math.ceil(sessions / max(options.concurrency, 1))
    return waves * options.timeout_s * _EVAL_ALLOWANCE + _DEADLINE_SLACK_S


def _facts(out: Path, options: GenerateOptions, dataset: DatasetFiles) -> dict[str, Any]:
    """What the report says about the runs behind it (every run into the directory)."""
    runs = _runs(out)
    return {
        "source": options.source,
        "attempts_per_instance": options.attempts,
        "runs": len(runs),
        "run_wall_s": round(sum(float(r.get("wall_s", 0.0)) for r in runs), 1),
        "models": sorted({str(r.get("model")) for r in runs}),
        "harnesses": sorted({str(r.get("harness")) for r in runs}),
        "dataset_rows": dataset.rows,
        "dataset_attempts": dataset.attempts,
        "trainable_tokens": dataset.trainable_tokens,
    }


def _runs(out: Path) -> list[dict[str, Any]]:
    """The facts of every finished run into ``out``, in order."""
    runs = []
    for path in sorted((out / RUNS).glob(f"*/{RUN_JSON}")):
        with contextlib.suppress(OSError, ValueError):
            runs.append(json.loads(path.read_text()))
    return runs
