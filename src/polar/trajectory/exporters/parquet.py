"""Parquet files of traces (pyarrow), written in batches for large runs.

Token columns are typed lists (int32 ids, int8 mask, float64 logprobs, so logprobs survive
exactly); messages, tools and metadata are JSON text columns. The files load directly with
``pyarrow.parquet.read_table`` or Hugging Face ``datasets.Dataset.from_parquet``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from polar.extras import require
from polar.schemas.trajectory import Trace, Trajectory
from polar.trajectory.exporters.base import CREDIT_COLUMNS, Exporter, credit_fields, trace_from

JSON_COLUMNS = (
    "prompt_messages",
    "response_messages",
    "tools",
    "metadata",
    "session",
    *CREDIT_COLUMNS,
)


def _pyarrow() -> Any:
    require("parquet", "the parquet exporter")
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa, pq


def schema() -> Any:
    pa, _ = _pyarrow()
    return pa.schema(
        [
            ("prompt_ids", pa.list_(pa.int32())),
            ("response_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("response_logprobs", pa.list_(pa.float64())),
            ("reward", pa.float64()),
            ("finish_reason", pa.string()),
            *[(name, pa.string()) for name in JSON_COLUMNS],
        ]
    )


class ParquetExporter(Exporter):
    name = "parquet"

    def __init__(self, tokenizer: Any = None, batch_rows: int = 512) -> None:
        super().__init__(tokenizer)
        self.batch_rows = batch_rows

    def row(self, trace: Trace, session: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "prompt_ids": trace.prompt_ids,
            "response_ids": trace.response_ids,
            "loss_mask": trace.loss_mask,
            "response_logprobs": trace.response_logprobs,
            "reward": trace.reward,
            "finish_reason": trace.finish_reason,
            "prompt_messages": _json(trace.prompt_messages),
            "response_messages": _json(trace.response_messages),
            "tools": _json(trace.tools),
            "metadata": _json(trace.metadata),
            "session": _json(dict(session)),
            **{name: _json(value) for name, value in credit_fields(trace).items()},
        }

    def trace(self, row: Mapping[str, Any]) -> Trace:
        extras = {name: orjson.loads(row[name]) for name in JSON_COLUMNS}
        extras["finish_reason"] = row["finish_reason"]
        return trace_from(
            row["prompt_ids"],
            row["response_ids"],
            row["loss_mask"],
            row["response_logprobs"],
            row["reward"],
            extras,
        )

    def write(self, trajectories: Iterable[Trajectory], path: str | Path) -> int:
        """Stream rows into one Parquet file, ``batch_rows`` at a time."""
        pa, pq = _pyarrow()
        count = 0
        batch: list[dict[str, Any]] = []
        with pq.ParquetWriter(str(path), schema()) as writer:
            for row in self.rows(trajectories):
                batch.append(row)
                if len(batch) >= self.batch_rows:
                    writer.write_table(pa.Table.from_pylist(batch, schema=schema()))
                    count += len(batch)
                    batch = []
            if batch or not count:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema()))
                count += len(batch)
        return count

    def read(self, path: str | Path) -> Iterator[dict[str, Any]]:
        _, pq = _pyarrow()
        for batch in pq.ParquetFile(str(path)).iter_batches(batch_size=self.batch_rows):
            yield from batch.to_pylist()


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()
