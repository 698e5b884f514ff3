"""``polar swe tasks`` and ``polar swe list``: SWE-bench-format instances as TaskRequest YAMLs
for ``polar submit``, and what an instance file holds."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from polar.cli.arguments import repo_path
from polar.config_loader import load_config, parse_config
from polar.errors import ConfigError
from polar.runtimes.registry import needs_image, runtime_names
from polar.swe.bundled import bundle_repos, bundled_instances
from polar.swe.instances import SWEInstance, load_instances
from polar.swe.tasks import SWETaskOptions, instance_task

# Flags that set an SWETaskOptions key directly (flag dest == key).
_OPTION_FLAGS = (
    "runtime",
    "harness",
    "model_name",
    "num_samples",
    "timeout_s",
    "test_timeout_s",
    "retries",
    "image_namespace",
    "image_registry",
    "image_tag",
    "test_cmd",
)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("swe", help="SWE-bench-format instances: task YAMLs, listings")
    verbs = parser.add_subparsers(dest="swe_command", metavar="ACTION", required=True)

    tasks = verbs.add_parser(
        "tasks",
        help="write one TaskRequest YAML per instance (for polar submit)",
        description="Write one TaskRequest YAML per instance into --out. With --bundled in a "
        "local runtime, the bundled repositories are written to OUT/repos as git bundles and "
        "the YAMLs point at them by absolute path.",
    )
    _instances_args(tasks)
    tasks.add_argument("--out", type=Path, required=True, help="directory for the YAMLs")
    tasks.add_argument("--runtime", choices=runtime_names())
    tasks.add_argument("--harness", help="harness preset or module:Class (default: pi)")
    tasks.add_argument("--model-name", help="the model name the harness is configured with")
    tasks.add_argument("--num-samples", type=int, help="sessions per task")
    tasks.add_argument("--timeout", dest="timeout_s", type=float, help="session budget (s)")
    tasks.add_argument("--test-timeout", dest="test_timeout_s", type=float, help="tests (s)")
    tasks.add_argument("--retries", type=int, help="reruns of failing test runs (flaky tests)")
    tasks.add_argument("--image-namespace", help="image namespace (default: swebench)")
    tasks.add_argument("--image-registry", help="registry host the images are pulled from")
    tasks.add_argument("--image-tag", help="image tag (default: latest)")
    tasks.add_argument("--test-cmd", help="the test command, for every instance")
    tasks.add_argument(
        "--repo",
        "--repos",
        dest="repos",
        action="extend",
        nargs="+",
        type=repo_path,
        default=[],
        metavar="OWNER/NAME=PATH",
        help="a local git repository or bundle per repo (local and bubblewrap runtimes)",
    )
    tasks.add_argument(
        "--options", type=Path, help="YAML of further task options (flags override it)"
    )
    tasks.set_defaults(func=write_tasks)

    listing = verbs.add_parser("list", help="instance ids, repos and test counts")
    _instances_args(listing)
    listing.set_defaults(func=list_instances)


def _instances_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "instances",
        nargs="?",
        metavar="INSTANCES",
        help=".jsonl, .json or .parquet file, a datasets directory, or a Hub dataset name "
        "in the local cache",
    )
    parser.add_argument("--bundled", action="store_true", help="the bundled task set")
    parser.add_argument("--split", help="the dataset split (default: test, or the only one)")


def _instances(args: argparse.Namespace) -> list[SWEInstance]:
    if bool(args.instances) == bool(args.bundled):
        raise ConfigError("name an instance file or dataset, or pass --bundled (one of them)")
    if args.bundled:
        return bundled_instances()
    return load_instances(args.instances, args.split)


def write_tasks(args: argparse.Namespace) -> int:
    instances = _instances(args)
    options = _options(args)
    out: Path = args.out
    if args.bundled and not needs_image(options.runtime):
        bundles = bundle_repos(out / "repos")
        options = options.model_copy(
            update={"repos": {**{r: str(p) for r, p in bundles.items()}, **options.repos}}
        )
    tasks = [instance_task(instance, options) for instance in instances]
    out.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        text = yaml.dump(
            task.model_dump(mode="json"), Dumper=_BlockDumper, sort_keys=False, allow_unicode=True
        )
        (out / f"{task.task_id}.yaml").write_text(text)
    print(f"wrote {len(tasks)} task(s) to {out} (submit one: polar submit {out}/<task>.yaml)")
    return 0


def _options(args: argparse.Namespace) -> SWETaskOptions:
    base = load_config(SWETaskOptions, args.options, what="task options") if args.options else None
    values = base.model_dump(exclude_unset=True) if base else {}
    values |= {k: getattr(args, k) for k in _OPTION_FLAGS if getattr(args, k) is not None}
    if args.repos:
        values["repos"] = {**values.get("repos", {}), **dict(args.repos)}
    return parse_config(SWETaskOptions, values, what="task options")


def list_instances(args: argparse.Namespace) -> int:
    instances = _instances(args)
    table = Table(title=f"{len(instances)} instance(s)")
    table.add_column("instance", overflow="fold")
    table.add_column("repo", overflow="fold")
    table.add_column("F2P", justify="right")  # FAIL_TO_PASS tests
    table.add_column("P2P", justify="right")  # PASS_TO_PASS tests
    table.add_column("base")
    for i in instances:
        commit = (i.base_commit or "-")[:8]
        table.add_row(
            i.instance_id, i.repo, str(len(i.FAIL_TO_PASS)), str(len(i.PASS_TO_PASS)), commit
        )
    Console().print(table)
    return 0


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings as ``|`` blocks where YAML allows one (not with trailing spaces)."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _text)
