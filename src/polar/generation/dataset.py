"""The accepted attempts as an SFT dataset: ``dataset.jsonl``, and ``dataset.parquet`` when
pyarrow is installed.

One row per trace of each accepted attempt, in both forms a trainer may want: the chat
``messages`` with their tool calls and ``tools`` (for trainers that apply a chat template), and
the captured ``input_ids`` with ``assistant_masks`` (1 on sampled tokens: the loss mask) and
``prompt_length`` (for trainers that must not re-tokenize). The rows are
:class:`~polar.trajectory.exporters.sft.SFTExporter`'s, with the instance, repository, attempt,
reward and the model's patch added. The files are rebuilt from the ledger every run, so after a
resume they hold every accepted attempt, in a stable order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from polar.extras import installed
from polar.generation.attempts import AttemptRecord, ordered, write_atomic
from polar.schemas.task import SessionResult
from polar.trajectory.exporters.base import session_context
from polar.trajectory.exporters.sft import SFTExporter

DATASET_JSONL = "dataset.jsonl"
DATASET_PARQUET = "dataset.parquet"
# Parquet keeps token columns typed and the free-form ones as JSON text.
JSON_COLUMNS = ("messages", "tools", "metadata", "session")

LoadResult = Callable[[AttemptRecord], SessionResult]


@dataclass(frozen=True)
class DatasetFiles:
    jsonl: Path
    parquet: Path | None
    rows: int
    attempts: int
    trainable_tokens: int


def attempt_rows(record: AttemptRecord, result: SessionResult) -> list[dict[str, Any]]:
    """The dataset rows of one accepted attempt: one per trace of its trajectory."""
    if result.trajectory is None:
        return []
    exporter = SFTExporter()
    session = session_context(result.trajectory)
    evaluation = result.evaluation.details if result.evaluation else {}
    rows = []
    for index, trace in enumerate(result.trajectory.traces):
        row = exporter.row(trace, session)
        rows.append(
            {
                "instance_id": record.instance_id,
                "repo": record.repo,
                "attempt": record.attempt,
                "trace_index": index,
                "session_id": record.session_id,
                "resolved": record.resolved,
                "model_patch": evaluation.get("model_patch"),
                **row,
                "reward": result.reward if result.reward is not None else row["reward"],
            }
        )
    return rows


def dataset_rows(records: Iterable[AttemptRecord], load: LoadResult) -> Iterator[dict[str, Any]]:
    """Rows of every accepted record, by instance id, attempt and trace."""
    for record in ordered(r for r in records if r.accepted):
        yield from attempt_rows(record, load(record))


def write_dataset(
    out_dir: Path, records: Iterable[AttemptRecord], load: LoadResult
) -> DatasetFiles:
    """Rewrite the dataset files from ``records``; each file is replaced whole."""
    rows = list(dataset_rows(records, load))
    jsonl = out_dir / DATASET_JSONL
    write_atomic(jsonl, b"".join(orjson.dumps(row) + b"\n" for row in rows))
    parquet = None
    if installed("parquet"):
        parquet = out_dir / DATASET_PARQUET
        write_parquet(parquet, rows)
    return DatasetFiles(
        jsonl=jsonl,
        parquet=parquet,
        rows=len(rows),
        attempts=len({(r["instance_id"], r["attempt"]) for r in rows}),
        trainable_tokens=sum(sum(r["assistant_masks"]) for r in rows),
    )


def parquet_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("instance_id", pa.string()),
            ("repo", pa.string()),
            ("attempt", pa.int32()),
            ("trace_index", pa.int32()),
            ("session_id", pa.string()),
            ("resolved", pa.bool_()),
            ("model_patch", pa.string()),
            ("messages", pa.string()),
            ("tools", pa.string()),
            ("input_ids", pa.list_(pa.int32())),
            ("assistant_masks", pa.list_(pa.int8())),
            ("prompt_length", pa.int32()),
            ("num_prompt_messages", pa.int32()),
            ("finish_reason", pa.string()),
            ("reward", pa.float64()),
            ("metadata", pa.string()),
            ("session", pa.string()),
        ]
    )


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    """The rows with typed token columns; ``messages``, ``tools``, ``metadata`` and ``session``
    as JSON text (their shapes vary from message to message)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = parquet_schema()
    flat = [
        {
            **{name: row.get(name) for name in schema.names},
            **{name: orjson.dumps(row.get(name)).decode() for name in JSON_COLUMNS},
        }
        for row in rows
    ]
    temporary = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pylist(flat, schema=schema), str(temporary))
    temporary.replace(path)
