"""Builders by name (``per_request``, ``prefix_merging``) or by ``module:Class``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polar.registry import Registry
from polar.trajectory.base import Builder, BuilderConfig
from polar.trajectory.per_request import PerRequestBuilder
from polar.trajectory.prefix_merging import PrefixMergingBuilder

builders: Registry[Builder] = Registry("builder")
builders.add(PerRequestBuilder.name, PerRequestBuilder)
builders.add(PrefixMergingBuilder.name, PrefixMergingBuilder)


def create_builder(
    strategy: str, config: BuilderConfig | Mapping[str, Any] | None = None
) -> Builder:
    """The builder a TaskRequest's ``builder: {strategy, config}`` names."""
    return builders.create(strategy, config)
