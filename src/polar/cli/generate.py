"""``polar generate``: SFT data from the attempts a model's tests accept (see docs/generate.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from polar.cli.arguments import positive_float, positive_int, repo_path
from polar.cli.local_run import (
    add_engine_arguments,
    add_harness_argument,
    local_run_fields,
    run_console,
    run_reporting,
)
from polar.errors import ConfigError
from polar.extras import require
from polar.generation.options import GenerateOptions, default_out
from polar.generation.run import run_generate
from polar.generation.summary import print_summary
from polar.runtimes.registry import runtime_names

_DEFAULT_ATTEMPTS = 1
_DEFAULT_CONCURRENCY = 4
_DEFAULT_TIMEOUT_S = 1800.0
_DEFAULT_MAX_TURNS = 50


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "generate",
        help="generate SFT data: run a model over SWE-style instances, keep what their tests pass",
        description=(
            "Run a harness against a model over SWE-bench-format instances (or the bundled "
            "set), each --attempts times, grade every attempt with the instance's tests "
            "(swe_tests), and write the accepted trajectories as an SFT dataset (chat messages "
            "with tool calls, and token ids with loss masks) plus a per-repository acceptance "
            "table. Rerunning the same command resumes: finished attempts are skipped. "
            "See docs/generate.md."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "instances", nargs="?", default=None, metavar="INSTANCES",
        help="instance file (.jsonl, .json, .parquet), a datasets directory, or a Hub dataset "
        "name in the local cache",
    )  # fmt: skip
    source = p.add_argument_group("instances")
    source.add_argument(
        "--bundled", action="store_true",
        help="the bundled tiny Python repositories with real bugs (runs on a laptop)",
    )  # fmt: skip
    source.add_argument("--split", default=None, help="dataset split (e.g. test)")
    source.add_argument(
        "--instances", dest="only", default=None, metavar="ID,...",
        help="only these instance ids",
    )  # fmt: skip
    source.add_argument(
        "--limit", type=positive_int, default=None, metavar="N", help="only the first N instances"
    )  # fmt: skip
    source.add_argument(
        "--repo", action="append", type=repo_path, default=[], metavar="OWNER/NAME=PATH",
        help="a local git repository or bundle for a repo (local and bubblewrap runtimes; "
        "repeatable)",
    )  # fmt: skip

    size = p.add_argument_group("attempts")
    size.add_argument(
        "--attempts", type=positive_int, default=_DEFAULT_ATTEMPTS, metavar="N",
        help="attempts per instance (raise it later to run only the new ones)",
    )  # fmt: skip
    size.add_argument(
        "--concurrency", type=positive_int, default=_DEFAULT_CONCURRENCY, metavar="C",
        help="sessions at once (run slots)",
    )  # fmt: skip
    size.add_argument(
        "--timeout", type=positive_float, default=_DEFAULT_TIMEOUT_S, metavar="S",
        help="each session's budget in seconds",
    )  # fmt: skip
    size.add_argument(
        "--test-timeout", type=positive_float, default=None, metavar="S",
        help="one run of an instance's tests, in seconds (default: 900)",
    )  # fmt: skip
    size.add_argument(
        "--retries", type=int, default=None, metavar="N",
        help="reruns of a failing test run (flaky tests; default: 0)",
    )  # fmt: skip
    size.add_argument(
        "--max-turns", type=positive_int, default=_DEFAULT_MAX_TURNS, metavar="N",
        help="model turns per session, for harnesses that have a limit",
    )  # fmt: skip
    size.add_argument(
        "--max-tokens", type=positive_int, default=None, metavar="N",
        help="output tokens per model call (default: 512 with the embedded engine, else no cap)",
    )  # fmt: skip
    size.add_argument("--temperature", type=float, default=0.7, metavar="T")
    size.add_argument(
        "--retry-errors", action="store_true",
        help="run again the attempts that ended in ERROR (a runtime, harness or evaluator "
        "failure rather than the model's)",
    )  # fmt: skip

    agent = p.add_argument_group("harness and sandbox")
    add_harness_argument(agent, "; installed if missing")
    agent.add_argument(
        "--compact-prompt", action="store_true",
        help="Pi with a one-line system prompt and two tools (for a small model)",
    )  # fmt: skip
    agent.add_argument(
        "--runtime", default=None, choices=runtime_names(),
        help="default: bubblewrap when it can sandbox here, else local",
    )  # fmt: skip
    agent.add_argument(
        "--image-registry", default=None, metavar="HOST",
        help="docker/apptainer: the registry the instance images come from",
    )  # fmt: skip
    agent.add_argument(
        "--image-namespace", default=None, metavar="NS",
        help="docker/apptainer: the images' namespace (default: swebench)",
    )  # fmt: skip
    agent.add_argument(
        "--keep-workspaces", action="store_true",
        help="keep each attempt's repository copies (by default deleted once it is recorded)",
    )  # fmt: skip

    engine = add_engine_arguments(p)
    engine.add_argument(
        "--demonstrator",
        action="store_true",
        help="no model: a scripted demonstrator applies each instance's gold patch through the "
        "harness's shell tool (real CLI, real tokens; accepted data in seconds, marked "
        "scripted-demonstrator)",
    )

    p.add_argument(
        "--out", type=Path, default=None, metavar="DIR",
        help="output directory (default: polar-runs/generate-<instances name>); rerun to resume",
    )  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if bool(args.instances) == bool(args.bundled):
        raise ConfigError("polar generate takes an instance file or --bundled (one of them)")
    if args.demonstrator and args.engine_url:
        raise ConfigError("--demonstrator is the engine: it takes no --engine-url")
    if not args.engine_url and not args.demonstrator:
        require("embedded", "polar generate without --engine-url")
    task_options: dict[str, Any] = {}
    if args.repo:
        task_options["repos"] = dict(args.repo)
    for key, value in (
        ("test_timeout_s", args.test_timeout),
        ("retries", args.retries),
        ("image_registry", args.image_registry),
        ("image_namespace", args.image_namespace),
    ):
        if value is not None:
            task_options[key] = value
    options = GenerateOptions(
        out=args.out or default_out(args.instances, args.bundled),
        instances=args.instances,
        bundled=args.bundled,
        split=args.split,
        only=tuple(i.strip() for i in (args.only or "").split(",") if i.strip()),
        limit=args.limit,
        attempts=args.attempts,
        concurrency=args.concurrency,
        retry_errors=args.retry_errors,
        keep_workspaces=args.keep_workspaces,
        compact_prompt=args.compact_prompt,
        demonstrator=args.demonstrator,
        task_options=task_options,
        **local_run_fields(args),
    )
    # Wide enough for the acceptance table's eleven columns and a repository name.
    loads_model = not args.engine_url and not args.demonstrator
    console = run_console(130, loads_model=loads_model, parquet_file="dataset.parquet")
    outcome = run_reporting(lambda: run_generate(options, console), console)
    if outcome is None:
        return 1
    print_summary(outcome, console)
    return 130 if outcome.interrupted else 0
