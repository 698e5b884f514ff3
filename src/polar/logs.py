"""How Polar logs: one JSON object per line for machines, or plain text for people.

A log line that reports a session's progress names its *event* (``session.run.start``) and
carries the session, task and node ids, so one session can be followed across the rollout
server and its gateway node with ``jq`` (see docs/observability.md#logs). :func:`log_event`
writes such a line; :func:`configure_logging` is what the ``polar`` command calls once, from
``--log-format`` / ``POLAR_LOG_FORMAT`` and ``--log-level`` / ``POLAR_LOG_LEVEL``.

``auto`` (the default format) is text when stderr is a terminal and JSON lines otherwise (a
service manager, a container, a pipe to a file). The level applies to Polar's own loggers;
other libraries' (httpx, uvicorn) are shown from WARNING up unless the level is ``debug``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from polar.errors import ConfigError

FORMATS = ("auto", "json", "text")
LEVELS = ("debug", "info", "warning", "error")
FORMAT_ENV = "POLAR_LOG_FORMAT"
LEVEL_ENV = "POLAR_LOG_LEVEL"
IDS = ("session_id", "task_id", "node_id")
"""The ids every JSON line carries (null when a line is about no session, task or node)."""

_HANDLER_NAME = "polar"
# What every LogRecord has; anything else on a record came in through ``extra=``.
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "event"}


def log_event(
    logger: logging.Logger,
    event: str,
    message: str,
    *,
    level: int = logging.INFO,
    session_id: str | None = None,
    task_id: str | None = None,
    node_id: str | None = None,
    exc_info: BaseException | bool | None = None,
    **fields: Any,
) -> None:
    """Log ``message`` as the named ``event`` with its ids and ``fields`` (JSON-able values).

    A line that reports a failure carries ``error``; ``None`` fields are left out."""
    if not logger.isEnabledFor(level):
        return
    extra = {"event": event, "session_id": session_id, "task_id": task_id, "node_id": node_id}
    extra.update({key: value for key, value in fields.items() if value is not None})
    logger.log(level, message, extra=extra, exc_info=exc_info)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, event, message, the three ids, then the
    record's other fields (``exc`` holds a traceback). ``ts`` is when the line is written
    (under the handler's lock), not when the record was made: threads logging at once would
    otherwise write lines a millisecond out of ts order, and a log sorted by ts would not
    read as it was written (CI dry run: test_one_session_followed_by_its_id)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "event": getattr(record, "event", None),
            "message": record.getMessage(),
        }
        for key in IDS:
            doc[key] = getattr(record, key, None)
        doc.update(_extra_fields(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message  event=… task_id=… key=value …`` for a terminal (an id the
    message already names is not repeated)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        pairs = {"event": getattr(record, "event", None)}
        for key in IDS:
            value = getattr(record, key, None)
            if value is not None and not _names(record.message, str(value)):
                pairs[key] = value
        pairs.update(_extra_fields(record))
        tail = " ".join(
            f"{key}={_text(value)}" for key, value in pairs.items() if value is not None
        )
        return f"{line}  {tail}" if tail else line


def _extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _RECORD_ATTRS and key not in IDS and not key.startswith("_")
    }


def _names(message: str, value: str) -> bool:
    """Whether ``message`` has ``value`` as a word of its own (node ``a`` is not in "task")."""
    return re.search(rf"(?<![\w.-]){re.escape(value)}(?![\w-])", message) is not None


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value if value and " " not in value else json.dumps(value)
    return json.dumps(value, default=str)


class _PolarFirst(logging.Filter):
    """Polar's records from ``level`` up; other libraries' from WARNING up (all at DEBUG)."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        ours = record.name == "polar" or record.name.startswith("polar.")
        floor = self.level if ours or self.level <= logging.DEBUG else logging.WARNING
        return record.levelno >= max(floor, self.level)


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is when a record arrives (a live progress view or a
    test may have swapped it), as logging's own last-resort handler does."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def resolve_format(format: str, stream: TextIO | None = None) -> str:
    """``json`` or ``text``: ``auto`` is text on a terminal, JSON otherwise."""
    if format not in FORMATS:
        raise ConfigError(f"log format must be one of {', '.join(FORMATS)}, got {format!r}")
    if format != "auto":
        return format
    stream = stream or sys.stderr
    return "text" if _isatty(stream) else "json"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def parse_level(level: int | str) -> int:
    if isinstance(level, int):
        return level
    if level.lower() not in LEVELS:
        raise ConfigError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    return int(logging.getLevelName(level.upper()))


def choose_settings(
    format: str | None,
    level: str | None,
    *,
    default_level: str = "warning",
    environ: Mapping[str, str] = os.environ,
) -> tuple[str, str]:
    """The format and level to log with: the command line's, else the environment's
    (``POLAR_LOG_FORMAT``, ``POLAR_LOG_LEVEL``), else ``auto`` and ``default_level``."""
    chosen_format = format or environ.get(FORMAT_ENV) or "auto"
    chosen_level = level or environ.get(LEVEL_ENV) or default_level
    for what, value, allowed, source in (
        ("format", chosen_format, FORMATS, "--log-format" if format else FORMAT_ENV),
        ("level", chosen_level, LEVELS, "--log-level" if level else LEVEL_ENV),
    ):
        if value.lower() not in allowed:
            raise ConfigError(
                f"{source}: log {what} must be one of {', '.join(allowed)}, got {value!r}"
            )
    return chosen_format.lower(), chosen_level.lower()


def make_handler(format: str, level: int | str, stream: TextIO | None = None) -> logging.Handler:
    """A handler writing ``format`` (json or text) from ``level`` up to ``stream`` (default:
    stderr as it is at each record)."""
    handler: logging.Handler = (
        logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    )
    number = parse_level(level)
    handler.setLevel(number)
    handler.addFilter(_PolarFirst(number))
    handler.setFormatter(JsonFormatter() if format == "json" else TextFormatter())
    return handler


def configure_logging(
    format: str = "auto", level: int | str = "warning", *, stream: TextIO | None = None
) -> logging.Handler:
    """Send log records to stderr (or ``stream``) as ``format``, from ``level`` up. Calling it
    again replaces the handler it installed before."""
    handler = make_handler(resolve_format(format, stream), level, stream)
    handler.set_name(_HANDLER_NAME)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(handler.level)
    return handler


@contextlib.contextmanager
def log_to_file(path: Path, level: int | str = "info") -> Iterator[logging.Handler]:
    """Also write JSON lines from ``level`` up to ``path`` while the block runs (what stderr
    shows is unchanged)."""
    root = logging.getLogger()
    handler = logging.FileHandler(path, encoding="utf-8")
    number = parse_level(level)
    handler.setLevel(number)
    handler.addFilter(_PolarFirst(number))
    handler.setFormatter(JsonFormatter())
    # Without any handler, warnings went to logging's last resort (stderr); keep that so.
    stderr = None if root.handlers else make_handler("text", logging.WARNING)
    before = root.level
    root.addHandler(handler)
    if stderr is not None:
        root.addHandler(stderr)
    root.setLevel(min(before, number) if before != logging.NOTSET else number)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        if stderr is not None:
            root.removeHandler(stderr)
        root.setLevel(before)
        handler.close()
