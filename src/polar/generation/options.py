"""What a ``polar generate`` run is asked to do: which instances, how many attempts, with which
model, harness and sandbox, and where its directory is."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar.stack.run import LocalRunOptions

# Output tokens per call when the embedded engine (a small model on a CPU) serves the run.
EMBEDDED_MAX_TOKENS = 512
BUNDLED = "bundled"


@dataclass(frozen=True, kw_only=True)
class GenerateOptions(LocalRunOptions):
    """A run's inputs. ``instances`` is an instance file or dataset (what
    :func:`polar.swe.instances.load_instances` reads); ``bundled`` takes the bundled set."""

    out: Path
    instances: str | None = None
    bundled: bool = False
    split: str | None = None
    only: tuple[str, ...] = ()
    limit: int | None = None
    attempts: int = 1
    concurrency: int = 4
    retry_errors: bool = False
    keep_workspaces: bool = False
    compact_prompt: bool = False
    timeout_s: float = 1800.0
    max_turns: int = 50
    max_tokens: int | None = None
    demonstrator: bool = False
    """Serve the run with the scripted demonstrator (gold patches through the harness's shell
    tool; :mod:`polar.stack.demonstrator`) instead of a model."""
    task_options: dict[str, Any] = field(default_factory=dict)
    """More :class:`polar.swe.tasks.SWETaskOptions` fields (repos, image registry, test
    timeout, ...), passed through as given."""

    @property
    def source(self) -> str:
        """Where the instances come from, in words."""
        return BUNDLED if self.bundled else str(self.instances)

    def output_cap(self, embedded: bool) -> int | None:
        """The cap on output tokens per call: the asked one, or a small one for the embedded
        engine (none for a served model, whose context window is the limit)."""
        if self.max_tokens is not None:
            return self.max_tokens
        return EMBEDDED_MAX_TOKENS if embedded else None


def default_out(instances: str | None, bundled: bool) -> Path:
    """A directory named after the instances, so running the same command again resumes."""
    name = BUNDLED if bundled or not instances else Path(instances.rstrip("/")).stem
    return Path("polar-runs") / f"generate-{name or 'instances'}"
