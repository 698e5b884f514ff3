"""``polar serve-rollout``, ``polar submit``, ``polar status`` and ``polar dashboard``: the rollout
service's CLI."""

from __future__ import annotations

import argparse
import os
import webbrowser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from polar.client import RolloutClient, RolloutTimeout
from polar.config_loader import load_config
from polar.delivery import RetryPolicy
from polar.rollout.app import create_rollout_app
from polar.rollout.config import RolloutServerConfig
from polar.rollout.dashboard import sign_in_url
from polar.schemas.task import SessionStatus, TaskRequest, TaskResult
from polar.serving import serve
from polar.stack.topology import Topology
from polar.tokens import is_loopback, read_token

DEFAULT_URL = "http://127.0.0.1:8200"
DEFAULT_TOKEN_FILE = RolloutServerConfig().token_file()
# `polar status` answers at once: one try, no retrying a server that is not there.
_ONE_TRY = RetryPolicy(initial_s=0.1, max_s=0.1, deadline_s=0.1)


def add_parser(sub: Any) -> None:
    serve = sub.add_parser(
        "serve-rollout",
        help="run the rollout server (tasks in, sessions over gateway nodes, results out)",
    )
    serve.add_argument("--config", help="topology YAML (see docs/rollout.md)")
    serve.add_argument("--host", help="bind address (default from the topology)")
    serve.add_argument("--port", type=int, help="port (default from the topology, 8200)")
    serve.add_argument("--data-dir", type=Path, help="where task state and results are kept")
    serve.add_argument(
        "--no-auth",
        action="store_true",
        help="no tokens at all (loopback only, for experiments); default: the admin token is "
        "rollout.admin_token, else made at first start in <data-dir>/rollout.token",
    )
    # A server's log is where its sessions' lifecycle events go (docs/observability.md#logs).
    serve.set_defaults(func=serve_rollout, default_log_level="info")

    submit = sub.add_parser("submit", help="submit a TaskRequest YAML to the rollout server")
    submit.add_argument("task", help="TaskRequest YAML (or JSON) file")
    _client_args(submit)
    submit.add_argument("--wait", action="store_true", help="show progress until it completes")
    submit.add_argument("--timeout", type=float, default=0, help="give up waiting after N s")
    submit.set_defaults(func=submit_task)

    status = sub.add_parser("status", help="nodes, tasks and progress of the rollout server")
    status.add_argument("task_id", nargs="?", help="show this task's sessions")
    _client_args(status)
    status.set_defaults(func=show_status)

    dashboard = sub.add_parser(
        "dashboard",
        help="print the sign-in link of the rollout server's live dashboard (docs/observability.md)",
    )
    _client_args(dashboard)
    dashboard.add_argument("--open", action="store_true", help="open it in a browser here")
    dashboard.set_defaults(func=show_dashboard)


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url", default=os.environ.get("POLAR_ROLLOUT_URL", DEFAULT_URL), help="rollout server"
    )
    p.add_argument(
        "--token",
        default=os.environ.get("POLAR_ROLLOUT_TOKEN"),
        help="rollout admin token (default: $POLAR_ROLLOUT_TOKEN, else --token-file)",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        default=Path(os.environ.get("POLAR_ROLLOUT_TOKEN_FILE", DEFAULT_TOKEN_FILE)),
        help="read the admin token from this file when --token is not given and the server "
        "is on this machine",
    )


def _token(args: argparse.Namespace) -> str | None:
    """--token, else the token file a server on this machine made (the default data dir's)."""
    if args.token:
        return str(args.token)
    if is_loopback(urlsplit(args.url).hostname or ""):
        return read_token(args.token_file)
    return None


def serve_rollout(args: argparse.Namespace) -> int:
    topology = Topology.from_yaml(args.config) if args.config else Topology()
    updates = {
        name: value
        for name, value in (("host", args.host), ("port", args.port), ("data_dir", args.data_dir))
        if value is not None
    }
    if args.no_auth:
        updates["auth"] = False
    config = topology.rollout_config().model_copy(update=updates)
    nodes = ", ".join(n.id for n in topology.nodes) or "none yet (nodes register themselves)"
    app = create_rollout_app(config)
    print(f"Polar rollout server on {config.base_url()} (nodes: {nodes}; data: {config.data_dir})")
    if not config.auth:
        print("auth is OFF: any process on this machine may drive this server")
    elif not config.admin_token:
        print(f"admin token (clients, and nodes enrolling): {config.token_file()}")
    print(f"dashboard: {config.base_url()}/dashboard (`polar dashboard` prints its sign-in link)")
    serve(app, host=config.host, port=config.port, limits=config.limits)
    return 0


def load_task(path: str | Path) -> TaskRequest:
    """A TaskRequest from YAML (JSON is YAML too), with the field that is wrong named."""
    return load_config(TaskRequest, path, what="task")


def submit_task(args: argparse.Namespace) -> int:
    task = load_task(args.task)
    console = Console()
    with RolloutClient(args.url, token=_token(args)) as client:
        summary = client.submit(task)
        console.print(f"submitted [bold]{summary.task_id}[/bold]: {summary.num_samples} sessions")
        if not args.wait:
            return 0
        result = _follow(client, console, task, args.timeout)
    if result is None:
        console.print("[yellow]stopped waiting; the task is still running[/yellow]")
        return 1
    _print_results(console, result)
    return 0 if all(r.status is SessionStatus.COMPLETED for r in result.results) else 1


def _follow(
    client: RolloutClient, console: Console, task: TaskRequest, timeout: float
) -> TaskResult | None:
    """Follow the task's events with a progress bar; the finished task, or None on timeout."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task(task.task_id, total=task.num_samples)
        try:
            done = client.wait(
                [task.task_id],
                timeout if timeout > 0 else float("inf"),
                lambda finished: progress.update(bar, completed=finished),
            )
        except RolloutTimeout:
            return None
    return done[task.task_id]


def _print_results(console: Console, result: TaskResult) -> None:
    table = Table(title=f"task {result.task_id}")
    for column in ("session", "status", "reward", "node", "seconds", "error"):
        table.add_column(column)
    for r in result.results:
        table.add_row(
            r.session_id[:14] + "…",
            r.status,
            "" if r.reward is None else f"{r.reward:g}",
            r.node_id or "",
            f"{r.timing.get('total', 0):.1f}",
            (r.error or "")[:60],
        )
    console.print(table)
    for path in result.result_paths:
        console.print(f"results: {path}")


def show_dashboard(args: argparse.Namespace) -> int:
    """The link carries the read-only viewer token derived from the admin token (never the
    admin token itself); opening it leaves that in a cookie for this server."""
    url = sign_in_url(args.url, _token(args))
    print(url)
    if args.open:
        webbrowser.open(url)
    return 0


def show_status(args: argparse.Namespace) -> int:
    console = Console()
    with RolloutClient(args.url, token=_token(args), retry=_ONE_TRY) as client:
        status = client.status()
        tasks = client.tasks()
        sessions = client.sessions(args.task_id) if args.task_id else []
    nodes = Table(title="nodes")
    for column in ("node", "health", "capacity", "queued", "init", "ready", "running", "postrun"):
        nodes.add_column(column)
    for n in status.nodes:
        health = "dead" if n.dead else "healthy" if n.healthy else "silent"
        if n.drained:
            health = "drained"
        elif n.draining:
            health += ", draining"
        st = n.stages
        nodes.add_row(
            n.node_id,
            health,
            str(n.capacity),
            *(str(st.get(k, 0)) for k in ("queued", "initializing", "ready", "running")),
            str(st.get("postrun", 0) + st.get("postrun_queued", 0)),
        )
    console.print(nodes)
    table = Table(title="tasks")
    for column in ("task", "status", "samples", "sessions"):
        table.add_column(column)
    for t in tasks:
        counts = " ".join(f"{k.lower()}={v}" for k, v in sorted(t.counts.items()))
        table.add_row(t.task_id, t.status, str(t.num_samples), counts)
    console.print(table)
    if sessions:
        detail = Table(title=f"sessions of {args.task_id}")
        for column in ("#", "session", "status", "node", "reward", "callback"):
            detail.add_column(column)
        for s in sessions:
            detail.add_row(
                str(s.sample_index),
                s.session_id,
                s.status,
                s.node_id or "",
                "" if s.reward is None else f"{s.reward:g}",
                s.callback,
            )
        console.print(detail)
    return 0
