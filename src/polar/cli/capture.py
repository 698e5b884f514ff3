"""``polar capture verify DB``: check that every stored record decodes exactly."""

from __future__ import annotations

import argparse
import dataclasses
import sqlite3
import sys
from pathlib import Path
from typing import Any

import orjson


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("capture", help="inspect capture stores")
    verbs = parser.add_subparsers(dest="capture_command", metavar="ACTION", required=True)
    verify = verbs.add_parser(
        "verify",
        help="decode every record, check every prefix chain and token count; exit 1 on any fault",
    )
    verify.add_argument("db", type=Path, metavar="DB", help="a capture store (SQLite file)")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(func=_verify)


def _verify(args: argparse.Namespace) -> int:
    from polar.capture.verify import verify_store  # numpy and zstd only when this runs

    try:
        report = verify_store(args.db)
    except OSError as exc:
        print(f"polar: error: {exc}", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:  # not a database, or one SQLite cannot open
        print(f"polar: error: cannot read {args.db}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(orjson.dumps(dataclasses.asdict(report), default=str).decode())
        return 0 if report.ok else 1
    for line in report.integrity:
        print(f"FAULT  sqlite quick_check: {line}")
    for session in report.sessions:
        state = "ok   " if session.ok else "FAULT"
        print(f"{state}  {session.session_id}  {session.records} records", end="")
        print(f", {len(session.faults)} faulty" if session.faults else "")
        for fault in session.faults:
            print(f"         seq {fault.seq} {fault.completion_id}: {fault.error}")
    print(
        f"{len(report.sessions)} sessions, {report.records} records, {report.faults} faults"
        f" in {args.db}"
    )
    return 0 if report.ok else 1
