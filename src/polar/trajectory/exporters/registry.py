"""Exporters by name (slime, verl, trl, nemo_rl, jsonl, parquet, sft) or by ``module:Class``."""

from __future__ import annotations

from typing import Any

from polar.registry import Registry
from polar.trajectory.exporters.base import Exporter
from polar.trajectory.exporters.jsonl import JsonlExporter
from polar.trajectory.exporters.nemo_rl import NemoRLExporter
from polar.trajectory.exporters.parquet import ParquetExporter
from polar.trajectory.exporters.sft import SFTExporter
from polar.trajectory.exporters.slime import SlimeExporter
from polar.trajectory.exporters.trl import TRLExporter
from polar.trajectory.exporters.verl import VerlExporter

exporters: Registry[Exporter] = Registry("exporter")
for _cls in (
    SlimeExporter,
    VerlExporter,
    TRLExporter,
    NemoRLExporter,
    JsonlExporter,
    ParquetExporter,
    SFTExporter,
):
    exporters.add(_cls.name, _cls)


def create_exporter(name: str, **options: Any) -> Exporter:
    """The exporter ``name`` names, e.g. ``create_exporter("slime", tokenizer=tok)``."""
    return exporters.create(name, **options)
