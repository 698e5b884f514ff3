"""``polar ray up | down | status | drain NODE``: Polar on a Ray cluster that already runs.

``up`` joins the cluster (``--address``, the file's ``ray.address`` or RAY_ADDRESS; it never
starts one), starts the rollout server actor and lets it keep one gateway per gateway node.
Without ``--detached`` it stays in the foreground and takes Polar down when it ends: Ctrl-C,
SIGTERM, SIGHUP (its terminal closed) or an error. Gateways are detached actors (a restarted
rollout server finds them again), so only this teardown removes them; after a SIGKILL, which
cannot be caught, ``polar ray down`` does. Ray is imported only when one of these runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from polar.errors import ConfigError

WAIT_TIMEOUT_S = 60.0
# What ends a foreground `polar ray up` and takes Polar down with it (SIGKILL cannot be caught).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "ray",
        help="run the rollout server and gateways as actors on a Ray cluster",
        description="Polar on Ray (docs/scale-out.md). Joins an existing cluster; never "
        "starts or stops Ray itself.",
    )
    verbs = parser.add_subparsers(dest="ray_command", metavar="ACTION", required=True)

    up = verbs.add_parser("up", help="start Polar's rollout server and gateways on the cluster")
    _common(up)
    up.add_argument(
        "--detached",
        action="store_true",
        help="leave Polar running and return (until `polar ray down`); default: run in the "
        "foreground and take Polar down on Ctrl-C",
    )
    up.add_argument(
        "--wait-nodes",
        type=int,
        default=0,
        metavar="N",
        help="return (or print 'ready') only once N gateways are registered",
    )
    up.add_argument(
        "--wait-timeout",
        type=float,
        default=WAIT_TIMEOUT_S,
        metavar="S",
        help=f"give up on --wait-nodes after S seconds (default {WAIT_TIMEOUT_S:g}; 0: no "
        "limit); in the foreground Polar is then taken down again",
    )
    up.set_defaults(func=_up, default_log_level="info")

    down = verbs.add_parser("down", help="kill Polar's actors (only those) on the cluster")
    _common(down)
    down.set_defaults(func=_down)

    status = verbs.add_parser("status", help="the rollout server's URL and its gateway nodes")
    _common(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=_status)

    drain = verbs.add_parser(
        "drain", help="send a node no more work; stop its gateway once it is done"
    )
    _common(drain)
    drain.add_argument("node", metavar="NODE", help="a node id from `polar ray status`")
    drain.add_argument(
        "--deadline",
        type=float,
        metavar="S",
        help="after S seconds, sessions still running there end as infra failures",
    )
    drain.set_defaults(func=_drain)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="polar ray YAML (docs/scale-out.md)")
    parser.add_argument(
        "--address", help="Ray cluster address (auto, HOST:PORT); default: the file or RAY_ADDRESS"
    )
    parser.add_argument("--namespace", help="Polar's Ray namespace (default polar)")


def _config(args: argparse.Namespace) -> Any:
    from polar.ray.config import PolarRayConfig

    config = PolarRayConfig.from_yaml(args.config) if args.config else PolarRayConfig()
    updates = {
        key: value
        for key, value in (("address", args.address), ("namespace", args.namespace))
        if value is not None
    }
    if getattr(args, "detached", False):
        updates["detached"] = True
    if updates:
        section = config.ray.model_copy(update=updates)
        config = config.model_copy(update={"ray": section})
    config.ray.resolved_address()  # no cluster named: say so before importing Ray
    return config


def _up(args: argparse.Namespace) -> int:
    import polar.ray as polar_ray
    from polar.ray.launcher import connect

    # Started in the background of a non-interactive shell, this process inherits SIGINT
    # ignored, and Python keeps an inherited ignore: take the default handler back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.wait_timeout < 0:
        raise ConfigError("--wait-timeout must be 0 (no limit) or positive (seconds)")
    config = _config(args)
    connect(config)  # before the handlers below: ray.init puts its own on SIGTERM
    if config.ray.detached:
        _start(args, config, polar_ray.up(config))
        return 0
    with until_signalled(lambda: polar_ray.down(config.ray.namespace)):
        # Held until the end: Ray kills a non-detached actor once its last handle is gone.
        polar = polar_ray.up(config)
        _start(args, config, polar)
        while True:
            signal.pause()
    return 0


def _start(args: argparse.Namespace, config: Any, polar: Any) -> None:
    print(f"Polar rollout server on Ray: {polar.rollout_url} (namespace {polar.namespace})")
    print(f"admin token: {config.rollout_config().token_file()} on the rollout server's node")
    sys.stdout.flush()
    if args.wait_nodes:
        nodes = polar.wait_nodes(args.wait_nodes, args.wait_timeout or None)
        print(f"ready: {len(nodes)} gateways: " + ", ".join(n.node_id for n in nodes))
        sys.stdout.flush()


class Stopped(Exception):
    """A stop signal (SIGTERM, SIGHUP) arrived: unwinds like Ctrl-C does."""


@contextlib.contextmanager
def until_signalled(teardown: Callable[[], list[str]]) -> Iterator[None]:
    """Run the block until SIGINT, SIGTERM or SIGHUP (or an error), then ``teardown`` once,
    deaf to further stop signals so a second Ctrl-C cannot cut it short."""

    def stop(signum: int, _frame: object) -> None:
        raise Stopped(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        with contextlib.suppress(KeyboardInterrupt, Stopped):
            yield
    finally:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        try:
            names = teardown()
            # After SIGHUP the terminal may be gone: the teardown has run, the report may not.
            with contextlib.suppress(OSError):
                print("took Polar down: " + (", ".join(names) if names else "nothing left"))
                sys.stdout.flush()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _down(args: argparse.Namespace) -> int:
    import polar.ray as polar_ray
    from polar.ray.launcher import connect

    config = _config(args)
    connect(config)
    names = polar_ray.down(config.ray.namespace)
    print("killed: " + (", ".join(names) if names else "nothing (no Polar actors)"))
    return 0


def _status(args: argparse.Namespace) -> int:
    import polar.ray as polar_ray

    polar = polar_ray.attach(_config(args))
    nodes = polar.nodes()
    if args.json:
        body = {"rollout_url": polar.rollout_url, "nodes": [n.model_dump() for n in nodes]}
        print(json.dumps(body, indent=2))
        return 0
    print(f"rollout server: {polar.rollout_url}")
    for node in nodes:
        print(
            f"  {node.node_id:20} {node_state(node):9} {node.url or '-'}  capacity {node.capacity}"
        )
    if not nodes:
        print("  no gateway nodes yet (does a node carry the polar_gateway resource?)")
    return 0


def node_state(node: Any) -> str:
    """One word for a NodeView: drained (stopped once drained) is not dead (lost)."""
    if node.drained:
        return "drained"
    if node.dead:
        return "dead"
    if not node.healthy:
        return "silent"
    return "draining" if node.draining else "healthy"


def _drain(args: argparse.Namespace) -> int:
    import polar.ray as polar_ray

    if args.deadline is not None and args.deadline <= 0:
        raise ConfigError("--deadline must be positive (seconds)")
    polar = polar_ray.attach(_config(args))
    view = polar.drain(args.node, args.deadline)
    deadline = f"; sessions left after {args.deadline:g}s fail (infra)" if args.deadline else ""
    print(f"node {view.node_id} draining{deadline}; its gateway stops once it is done")
    return 0
