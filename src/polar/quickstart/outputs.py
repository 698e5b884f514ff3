"""Writing a finished run's directory: trajectories, raw captures, results, per-session logs.

Layout (the stack itself already wrote ``captures.db``, ``rollout/`` and ``sessions/``)::

    run_dir/
      results.jsonl           one SessionResult per session (status, reward, timing, trajectory)
      trajectories.jsonl      one Trace per line (the public schema) with its session context
      trajectories.parquet    the same traces as typed columns (with polar[parquet] installed)
      captures.db             the gateway's capture store (SQLite), as written during the run
      captures.jsonl          every captured model call (CaptureRecord), in call order
      sessions/<id>/          the session's runtime dir: workspace/, home/, logs/
      sessions/<id>/session.log   what happened, call by call, in plain text
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from polar.capture.records import CaptureRecord
from polar.capture.store import CaptureStore
from polar.extras import installed
from polar.schemas.ids import path_segment
from polar.schemas.task import SessionResult
from polar.trajectory.exporters.registry import create_exporter

RESULTS = "results.jsonl"
TRAJECTORIES_JSONL = "trajectories.jsonl"
TRAJECTORIES_PARQUET = "trajectories.parquet"
CAPTURES_DB = "captures.db"
CAPTURES_JSONL = "captures.jsonl"
SESSIONS = "sessions"
SESSION_LOG = "session.log"
_TEXT_LIMIT = 1500


def read_captures(run_dir: Path, session_ids: Iterable[str]) -> dict[str, list[CaptureRecord]]:
    """Every captured call of each session, from the run's capture store."""
    store = CaptureStore(run_dir / CAPTURES_DB)
    try:
        return {sid: store.records(sid) for sid in session_ids}
    finally:
        store.close()


def write_outputs(
    run_dir: Path, results: list[SessionResult], captures: dict[str, list[CaptureRecord]]
) -> None:
    """Write the run's data files and one log per session."""
    with (run_dir / RESULTS).open("w") as f:
        for result in results:
            f.write(result.model_dump_json() + "\n")
    trajectories = [r.trajectory for r in results if r.trajectory is not None]
    create_exporter("jsonl").write(trajectories, run_dir / TRAJECTORIES_JSONL)
    if installed("parquet"):
        create_exporter("parquet").write(trajectories, run_dir / TRAJECTORIES_PARQUET)
    with (run_dir / CAPTURES_JSONL).open("w") as f:
        for result in results:
            for record in captures.get(result.session_id, []):
                f.write(record.model_dump_json() + "\n")
    for result in results:
        session_dir = run_dir / SESSIONS / path_segment(result.session_id)
        session_dir.mkdir(parents=True, exist_ok=True)
        log = session_log(result, captures.get(result.session_id, []))
        (session_dir / SESSION_LOG).write_text(log)


def session_log(result: SessionResult, records: list[CaptureRecord]) -> str:
    """A readable account of one session: outcome, timing, then each call's new messages."""
    sample = "?" if result.sample_index is None else result.sample_index
    lines = [
        f"session {result.session_id}  task {result.task_id}  sample {sample}",
        f"status {result.status.value}  reward {result.reward}  node {result.node_id}",
        "timing  " + "  ".join(f"{k} {v:.1f}s" for k, v in result.timing.items()),
    ]
    if result.error:
        lines.append(f"error  {result.error}")
    evaluation = result.evaluation.details if result.evaluation else {}
    if evaluation:
        lines.append(f"check  exit {evaluation.get('exit_code')}  passed {result.passed}")
        if evaluation.get("output_tail"):
            lines.append(_indent(str(evaluation["output_tail"])))
    seen = 0
    for number, record in enumerate(records, 1):
        messages = list(record.upstream_request.get("messages") or [])
        took = record.finished_at - record.started_at
        lines.append("")
        lines.append(
            f"--- call {number}: {len(record.prompt_ids)} prompt tokens, "
            f"{len(record.sampled_ids)} sampled, finish {record.finish_reason}, {took:.1f}s"
            + (f", tags {record.tags}" if record.tags else "")
        )
        # Messages already shown (the previous prompt and its reply) are not repeated.
        for message in messages[seen:]:
            lines.append(_message_line(">", message))
        lines.append(_message_line("<", record.response))
        seen = len(messages) + 1
    return "\n".join(lines) + "\n"


def _message_line(arrow: str, message: dict[str, Any]) -> str:
    role = message.get("role", "?")
    text = _content_text(message.get("content"))
    calls = [
        f"{c.get('function', {}).get('name')}({c.get('function', {}).get('arguments')})"
        for c in message.get("tool_calls") or []
    ]
    body = "\n".join(part for part in (text, *calls) if part)
    if len(body) > _TEXT_LIMIT:
        body = body[:_TEXT_LIMIT] + f" [... {len(body) - _TEXT_LIMIT} more chars]"
    return f"{arrow} {role}:\n{_indent(body)}"


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else json.dumps(content)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
