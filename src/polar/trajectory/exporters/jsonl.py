"""Plain JSON lines: one ``Trace`` per line, exactly as the public schema dumps it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polar.schemas.trajectory import Trace
from polar.trajectory.exporters.base import Exporter


class JsonlExporter(Exporter):
    name = "jsonl"

    def row(self, trace: Trace, session: Mapping[str, Any]) -> dict[str, Any]:
        return {**trace.model_dump(mode="json"), "session": dict(session)}

    def trace(self, row: Mapping[str, Any]) -> Trace:
        return Trace.model_validate({k: v for k, v in row.items() if k != "session"})
