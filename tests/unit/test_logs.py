"""polar.logs: JSON lines and text, the level and format the ``polar`` command picks, and the
quickstart's log file."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from polar.cli.main import build_parser, main
from polar.errors import ConfigError
from polar.logs import (
    IDS,
    JsonFormatter,
    choose_settings,
    configure_logging,
    log_event,
    log_to_file,
    resolve_format,
)

log = logging.getLogger("polar.test")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_an_event_is_one_json_line_with_its_ids_and_fields() -> None:
    stream = io.StringIO()
    configure_logging("json", "info", stream=stream)
    log_event(
        log,
        "session.run.end",
        "session s1 run: error\nsecond line",
        session_id="s1",
        task_id="t1",
        node_id="n1",
        seconds=1.5,
        outcome="error",
        reward=None,
        error="run failed: exit 7",
    )
    [line] = stream.getvalue().splitlines()  # the newline in the message stays inside
    record = json.loads(line)
    assert record["event"] == "session.run.end"
    assert record["level"] == "INFO" and record["logger"] == "polar.test"
    assert record["message"] == "session s1 run: error\nsecond line"
    assert {k: record[k] for k in IDS} == {"session_id": "s1", "task_id": "t1", "node_id": "n1"}
    assert record["seconds"] == 1.5 and record["error"] == "run failed: exit 7"
    assert "reward" not in record  # None fields are left out
    assert record["ts"].endswith("Z")


def test_a_plain_record_carries_null_ids_and_a_traceback() -> None:
    stream = io.StringIO()
    configure_logging("json", "warning", stream=stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("it broke: %s", "badly")
    [record] = lines(stream)
    assert record["message"] == "it broke: badly"
    assert record["event"] is None and all(record[k] is None for k in IDS)
    assert "RuntimeError: boom" in record["exc"]


def test_text_is_one_readable_line_with_the_ids() -> None:
    stream = io.StringIO()
    configure_logging("text", "info", stream=stream)
    log_event(log, "session.ready", "session s1 ready", session_id="s1", node_id="n1")
    log.warning("plain")
    first, second = stream.getvalue().splitlines()
    assert "INFO polar.test: session s1 ready" in first
    assert first.endswith("event=session.ready node_id=n1")  # s1 is in the message already
    log_event(log, "session.accepted", "session s2 accepted", session_id="s2", node_id="s")
    assert stream.getvalue().splitlines()[-1].endswith("event=session.accepted node_id=s")
    assert second.endswith("WARNING polar.test: plain")


def test_the_level_is_polars_other_libraries_start_at_warning() -> None:
    stream = io.StringIO()
    configure_logging("json", "info", stream=stream)
    log.debug("hidden")
    log.info("shown")
    logging.getLogger("httpx").info("HTTP Request: POST ... 200")  # per request: too chatty
    logging.getLogger("uvicorn.error").warning("shown too")
    assert [r["message"] for r in lines(stream)] == ["shown", "shown too"]

    stream = io.StringIO()
    configure_logging("json", "debug", stream=stream)
    logging.getLogger("httpx").debug("everything at debug")
    assert [r["message"] for r in lines(stream)] == ["everything at debug"]


def test_configuring_again_replaces_the_handler() -> None:
    configure_logging("json", "info", stream=io.StringIO())
    configure_logging("text", "warning", stream=io.StringIO())
    ours = [h for h in logging.getLogger().handlers if h.get_name() == "polar"]
    assert len(ours) == 1 and ours[0].level == logging.WARNING


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_auto_is_text_on_a_terminal_and_json_otherwise() -> None:
    assert resolve_format("auto", _Stream(tty=True)) == "text"
    assert resolve_format("auto", _Stream(tty=False)) == "json"
    assert resolve_format("json", _Stream(tty=True)) == "json"
    with pytest.raises(ConfigError, match="log format"):
        resolve_format("xml")


def test_the_flag_wins_over_the_environment_which_wins_over_the_default() -> None:
    env = {"POLAR_LOG_FORMAT": "text", "POLAR_LOG_LEVEL": "error"}
    assert choose_settings(None, None, environ={}) == ("auto", "warning")
    assert choose_settings(None, None, default_level="info", environ={}) == ("auto", "info")
    assert choose_settings(None, None, environ=env) == ("text", "error")
    assert choose_settings("json", "debug", environ=env) == ("json", "debug")
    with pytest.raises(ConfigError, match="POLAR_LOG_FORMAT"):
        choose_settings(None, None, environ={"POLAR_LOG_FORMAT": "xml"})
    with pytest.raises(ConfigError, match="POLAR_LOG_LEVEL"):
        choose_settings(None, None, environ={"POLAR_LOG_LEVEL": "loud"})


def test_the_log_file_gets_info_while_stderr_stays_as_it_was(tmp_path: Path) -> None:
    stderr = io.StringIO()
    configure_logging("text", "warning", stream=stderr)
    root_level = logging.getLogger().level
    path = tmp_path / "log.jsonl"
    with log_to_file(path):
        log_event(log, "task.submitted", "task t submitted", task_id="t", num_samples=2)
        logging.getLogger("httpx").info("not ours, not a warning")
        log.warning("a warning goes to both")
    log.info("after the block: nowhere")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["event"] for r in records] == ["task.submitted", None]
    assert records[0]["num_samples"] == 2
    assert stderr.getvalue().count("\n") == 1 and "a warning goes to both" in stderr.getvalue()
    assert logging.getLogger().level == root_level


def test_the_log_options_go_before_or_after_the_command() -> None:
    parser = build_parser()
    before = parser.parse_args(["--log-format", "json", "status"])
    after = parser.parse_args(["status", "--log-format", "text", "--log-level", "info"])
    assert before.log_format == "json" and before.log_level is None
    assert after.log_format == "text" and after.log_level == "info"
    assert not hasattr(before, "default_log_level")  # a client command: warning
    for command in ("serve-rollout", "serve-gateway"):
        assert parser.parse_args([command]).default_log_level == "info"


def test_a_bad_environment_value_is_a_plain_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("POLAR_LOG_FORMAT", "yaml")
    assert main(["status"]) == 2
    assert "POLAR_LOG_FORMAT: log format must be one of auto, json, text" in capsys.readouterr().err


def test_a_json_lines_ts_is_when_it_is_written_so_lines_are_in_ts_order() -> None:
    """Two threads: the record made first may be written second. Stamped at writing, the
    lines stay in ts order whatever the records' own creation times."""
    formatter = JsonFormatter()
    made_first = logging.LogRecord("polar.a", logging.INFO, __file__, 1, "first", None, None)
    made_second = logging.LogRecord("polar.b", logging.INFO, __file__, 1, "second", None, None)
    made_first.created, made_second.created = 2.0, 1.0  # made out of order, long ago
    stamps = [json.loads(formatter.format(r))["ts"] for r in (made_first, made_second)]
    assert stamps == sorted(stamps)
    assert all(ts.startswith(str(datetime.now(UTC).year)) for ts in stamps)
