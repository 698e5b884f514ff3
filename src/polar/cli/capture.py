"""``polar capture verify DB``: check that every stored record decodes exactly;
``polar capture export DB --format F -o OUT``: the store as a serving trace (JSONL)."""

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
    export = verbs.add_parser(
        "export",
        help="write the captured calls as a serving trace: agentic_replay (Mooncake/AIPerf "
        "requests per session) or grpo_rollout (one row per GRPO sample)",
    )
    export.add_argument("db", type=Path, metavar="DB", help="a capture store (SQLite file)")
    export.add_argument(
        "--format",
        default="agentic_replay",
        help="agentic_replay, grpo_rollout, or module:Class (default agentic_replay)",
    )
    export.add_argument("-o", "--out", type=Path, required=True, help="the JSONL file written")
    export.add_argument(
        "--block-size", type=int, default=512, help="tokens per hash_ids block (default 512)"
    )
    export.add_argument(
        "--session", action="append", dest="sessions", metavar="ID", help="only this session"
    )
    export.set_defaults(func=_export)


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


def _export(args: argparse.Namespace) -> int:
    from polar.errors import ConfigError, CorruptRecord
    from polar.trajectory.serving_traces.registry import export_trace

    try:
        rows = export_trace(
            args.db, args.format, args.out, block_size=args.block_size, session_ids=args.sessions
        )
    except (OSError, sqlite3.Error, ConfigError, CorruptRecord, ValueError) as exc:
        print(f"polar: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {rows} {args.format} rows to {args.out}")
    return 0
