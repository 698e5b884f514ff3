"""The interface every evaluator implements: score one finished session.

An evaluator runs in POSTRUN, after the trajectory is built and before the runtime is torn
down. It gets the live runtime (to run tests where the agent worked), the trajectory, the task,
a snapshot of the agent's workspace (read through it, never through a host path, so a remote
runtime fits), and a factory for a fresh runtime from the task's original spec (for
``refresh_runtime``: grading a clean copy with only the agent's changes applied). It returns a
reward, a pass/fail verdict when it has one, and JSON-safe details for the session's metadata.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel

from polar import config_loader
from polar.runtimes.base import Runtime
from polar.runtimes.snapshot import WorkspaceSnapshot
from polar.schemas.task import EvaluatorSpec, TaskRequest
from polar.schemas.trajectory import Trajectory

ConfigT = TypeVar("ConfigT", bound=BaseModel)


@dataclass(frozen=True)
class EvaluationResult:
    reward: float
    passed: bool | None
    """None when the evaluator has no verdict, only a score."""
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvaluationContext:
    runtime: Runtime
    """The session's runtime, still running."""
    trajectory: Trajectory
    task: TaskRequest
    workspace: WorkspaceSnapshot
    """The agent's workspace as the runtime hands it over (``Runtime.workspace_snapshot``)."""
    fresh_runtime: Callable[[], Runtime]
    """An unstarted runtime from ``task.runtime`` in a new session dir; the caller stops it."""


class Evaluator(ABC):
    """Built from the task's :class:`EvaluatorSpec` (strategy, config, env, refresh_runtime)."""

    name: ClassVar[str]

    def __init__(self, spec: EvaluatorSpec) -> None:
        self.spec = spec

    @abstractmethod
    async def evaluate(self, ctx: EvaluationContext) -> EvaluationResult: ...


def parse_config(model: type[ConfigT], spec: EvaluatorSpec) -> ConfigT:
    """``spec.config`` validated against ``model``, or a ConfigError naming the bad keys."""
    return config_loader.parse_config(
        model, spec.config, what=f"config of evaluator {spec.strategy!r}"
    )
