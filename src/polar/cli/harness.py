"""``polar harness install NAME|all`` and ``polar harness list``: the agent CLIs Polar runs
(``install --latest``: npm's newest, apart from the pinned ones, to see drift early)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from polar.errors import HarnessError
from polar.harnesses.install import (
    default_prefix,
    install,
    is_installed,
    latest_prefix,
    pinned_packages,
)
from polar.harnesses.registry import CLI_PRESETS, create_harness, harnesses


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("harness", help="install and list the agent CLIs (harness presets)")
    verbs = parser.add_subparsers(dest="harness_command", metavar="ACTION", required=True)

    inst = verbs.add_parser("install", help="install a preset's CLI from the pinned lockfile")
    inst.add_argument("names", nargs="+", metavar="NAME", help=f"{', '.join(CLI_PRESETS)} or all")
    inst.add_argument(
        "--prefix",
        type=Path,
        default=None,
        help=f"install prefix (default: $POLAR_HARNESS_PREFIX or {default_prefix()}; with "
        f"--latest, {latest_prefix()})",
    )
    inst.add_argument(
        "--latest",
        action="store_true",
        help="npm's latest version of each CLI instead of the pinned one, into a prefix of its "
        "own (the drift check: POLAR_CLI_VERSIONS=latest pytest -m cli_drift runs the real-CLI "
        "tests on it)",
    )
    inst.set_defaults(func=_install)

    show = verbs.add_parser("list", help="the presets, their pinned CLIs and what is installed")
    show.add_argument("--prefix", type=Path, default=None)
    show.set_defaults(func=_list)


def _install(args: argparse.Namespace) -> int:
    try:
        install(args.names, args.prefix, latest=args.latest)
    except HarnessError as exc:
        print(f"polar: error: {exc}")
        return 1
    return 0


def _list(args: argparse.Namespace) -> int:
    prefix = args.prefix or default_prefix()
    pinned = pinned_packages()
    print(f"prefix: {prefix}")
    for name in harnesses:
        harness = create_harness(name)
        if harness.npm_package is None:
            print(f"  {name:<12} (runs any command; nothing to install)")
            continue
        state = "installed" if is_installed(harness, prefix) else "not installed"
        package = f"{harness.npm_package}@{pinned[harness.npm_package]}"
        print(f"  {name:<12} {package:<40} {state}")
    return 0
