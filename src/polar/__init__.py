"""Polar: token-faithful rollouts over any LLM agent harness.

The public API: what a user's script, trainer or plugin imports, by the name it has here
(``from polar import TaskRequest, RolloutClient, Harness``). Each name loads on first use from
the module that owns it, so ``import polar`` imports none of them (a gateway process, or a
command's ``--help``, never pays for the trainer or the engines). The owning modules stay
importable as they are; this list only says which of their names are the contract.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # for type checkers only; the layer test reads no import from this block
    from polar.capture.records import CaptureRecord
    from polar.capture.store import CaptureStore
    from polar.client import AsyncRolloutClient, RolloutClient
    from polar.engines.base import Engine
    from polar.errors import ConfigError, PolarError
    from polar.evaluators.base import Evaluator
    from polar.gateway.config import GatewayConfig
    from polar.harnesses.base import Harness, HarnessContext, HarnessLaunch, HarnessSettings
    from polar.providers.base import Provider
    from polar.registry import Registry
    from polar.rendering.families.base import Family
    from polar.rendering.model_files import load_tokenizer
    from polar.rendering.parsers.base import ToolParser
    from polar.rollout.config import RolloutServerConfig
    from polar.runtimes.base import Runtime
    from polar.schemas.sampling import SamplingPolicy
    from polar.schemas.task import (
        AgentSpec,
        BuilderSpec,
        EvaluatorSpec,
        RuntimeSpec,
        SessionResult,
        SessionStatus,
        TaskRequest,
        TaskResult,
    )
    from polar.schemas.trajectory import Trace, Trajectory
    from polar.stack.local import LocalStack
    from polar.stack.topology import Topology
    from polar.trajectory.base import Builder
    from polar.trajectory.exporters.base import Exporter
    from polar.trajectory.exporters.registry import create_exporter
    from polar.trajectory.registry import create_builder

# name -> the module that owns it
_HOMES: dict[str, str] = {
    # tasks and their results
    "TaskRequest": "polar.schemas.task",
    "AgentSpec": "polar.schemas.task",
    "RuntimeSpec": "polar.schemas.task",
    "EvaluatorSpec": "polar.schemas.task",
    "BuilderSpec": "polar.schemas.task",
    "SessionResult": "polar.schemas.task",
    "SessionStatus": "polar.schemas.task",
    "TaskResult": "polar.schemas.task",
    "Trace": "polar.schemas.trajectory",
    "Trajectory": "polar.schemas.trajectory",
    "SamplingPolicy": "polar.schemas.sampling",
    # errors
    "PolarError": "polar.errors",
    "ConfigError": "polar.errors",
    # running Polar: the client, the servers' configs, the one-process stack
    "RolloutClient": "polar.client",
    "AsyncRolloutClient": "polar.client",
    "GatewayConfig": "polar.gateway.config",
    "RolloutServerConfig": "polar.rollout.config",
    "Topology": "polar.stack.topology",
    "LocalStack": "polar.stack.local",
    # the records and what is built from them
    "CaptureStore": "polar.capture.store",
    "CaptureRecord": "polar.capture.records",
    "create_builder": "polar.trajectory.registry",
    "create_exporter": "polar.trajectory.exporters.registry",
    "load_tokenizer": "polar.rendering.model_files",
    # what a plugin subclasses (one module and one registry line, or ``module:Class``)
    "Registry": "polar.registry",
    "Harness": "polar.harnesses.base",
    "HarnessContext": "polar.harnesses.base",
    "HarnessLaunch": "polar.harnesses.base",
    "HarnessSettings": "polar.harnesses.base",
    "Provider": "polar.providers.base",
    "Engine": "polar.engines.base",
    "Family": "polar.rendering.families.base",
    "ToolParser": "polar.rendering.parsers.base",
    "Runtime": "polar.runtimes.base",
    "Evaluator": "polar.evaluators.base",
    "Builder": "polar.trajectory.base",
    "Exporter": "polar.trajectory.exporters.base",
}

__all__ = [
    "AgentSpec",
    "AsyncRolloutClient",
    "Builder",
    "BuilderSpec",
    "CaptureRecord",
    "CaptureStore",
    "ConfigError",
    "Engine",
    "Evaluator",
    "EvaluatorSpec",
    "Exporter",
    "Family",
    "GatewayConfig",
    "Harness",
    "HarnessContext",
    "HarnessLaunch",
    "HarnessSettings",
    "LocalStack",
    "PolarError",
    "Provider",
    "Registry",
    "RolloutClient",
    "RolloutServerConfig",
    "Runtime",
    "RuntimeSpec",
    "SamplingPolicy",
    "SessionResult",
    "SessionStatus",
    "TaskRequest",
    "TaskResult",
    "ToolParser",
    "Topology",
    "Trace",
    "Trajectory",
    "__version__",
    "create_builder",
    "create_exporter",
    "load_tokenizer",
]


def load_lazily(namespace: dict[str, Any], homes: Mapping[str, str], name: str) -> Any:
    """A module ``__getattr__``'s body: ``name`` from the module ``homes`` names for it, kept
    in the package's ``namespace`` (its ``globals()``) so it loads once."""
    home = homes.get(name)
    if home is None:
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
    value = namespace[name] = getattr(importlib.import_module(home), name)
    return value


def __getattr__(name: str) -> Any:
    return load_lazily(globals(), _HOMES, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
