"""The embedded trainer's YAML (``polar train CONFIG``): model, tasks, sampling, optimisation.

Strict like every Polar config: an unknown key is an error naming where it sits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from polar.config_loader import load_config
from polar.training.config import AlgorithmConfig


class TaskConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field("arithmetic", description="A bundled task source or module:function.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the task source."
    )
    per_step: int = Field(4, ge=1, description="Tasks (GRPO groups) per training step.")
    num_samples: int = Field(4, ge=1, description="Sessions per task: the group size.")
    timeout_s: float = Field(600.0, gt=0, description="Wait at most this long for a step's tasks.")


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: int = Field(0, ge=0, description="Held-out tasks per evaluation; 0 turns it off.")
    num_samples: int = Field(1, ge=1)
    every: int = Field(0, ge=0, description="Also every N steps (0: only before and after).")
    temperature: float | None = Field(
        None, ge=0, description="Sampling temperature for evaluation (default: the training one)."
    )


class SamplingConfig(BaseModel):
    """What the gateway imposes on rollouts (the agent may ask for a temperature in eval)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1, description="Must stay 1 for training.")
    max_tokens: int = Field(64, gt=0)


class OptimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = Field(1.0, gt=0)
    epochs: int = Field(1, ge=1, description="Passes over each step's batch.")
    minibatches: int = Field(1, ge=1, description="Optimizer steps per pass.")
    micro_batch_size: int = Field(8, ge=1, description="Traces per forward/backward.")
    gradient_checkpointing: bool = Field(
        True,
        description="Keep only each decoder layer's input for the backward pass and recompute "
        "the rest (about a third more compute): a micro-batch of 4 tool_use sessions held "
        "~4 GB of activations without it. Off for a model with dropout.",
    )


class SFTConfig(BaseModel):
    """A warm start before GRPO: demonstrations through the tasks' own harness by a scripted
    demonstrator (each task's ``solution`` commands), then SFT on the accepted ones."""

    model_config = ConfigDict(extra="forbid")

    tasks: int = Field(0, ge=0, description="Training tasks to demonstrate; 0: no warm start.")
    demonstrations: int = Field(1, ge=1, description="Demonstrated sessions per task.")
    epochs: int = Field(1, ge=1, description="Passes over the accepted demonstrations.")
    lr: float = Field(1e-4, gt=0)
    micro_batch_size: int = Field(4, ge=1, description="Rows per optimizer step.")
    forward_rows: int = Field(
        2,
        ge=1,
        description="Rows per forward/backward within a step: the same gradient as all of the "
        "step's rows at once, with that fraction of the activations (memory).",
    )
    gradient_checkpointing: bool = Field(
        True,
        description="Recompute each decoder layer in the backward pass instead of keeping its "
        "activations (the rows' shared prompt prefix is then recomputed per row): 2 rows of a "
        "tool_use warm start held ~2.5 GB without it, the peak of the whole run.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Task-source options for the demonstrated tasks, over tasks.options: "
        "e.g. {kinds: [write, count]} demonstrates two kinds and leaves the third to GRPO.",
    )


class MemoryConfig(BaseModel):
    """glibc's allocator in a training run (:mod:`polar.training.allocator`): a run's phases
    run in different threads, and with glibc's defaults each keeps what it freed."""

    model_config = ConfigDict(extra="forbid")

    arenas: int | None = Field(
        1,
        ge=1,
        description="malloc arenas (M_ARENA_MAX): 1 lets the engine's and the trainer's "
        "threads reuse each other's freed blocks; null: glibc's default (8 per core).",
    )
    train_mmap_threshold_kib: int | None = Field(
        1024,
        ge=0,
        description="While the model trains (SFT, updates), blocks this size and up get a "
        "mapping of their own, returned to the system at free (M_MMAP_THRESHOLD): an SFT of "
        "16 tool_use rows peaked at 2.9 instead of 3.5 GB with 1 MiB, ~17% slower. Serving "
        "keeps the heap. null: glibc's default throughout.",
    )
    trim_between_phases: bool = Field(
        True, description="Return free pages to the system after each phase (malloc_trim)."
    )


class CheckpointConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    every: int = Field(10, ge=0, description="Save every N steps (0: only at the end).")
    keep: int = Field(2, ge=1, description="Most recent checkpoints kept.")


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field("smollm2", description="smollm2, tiny, an HF checkpoint dir or a .gguf.")
    dtype: str = "float32"
    seed: int = 0
    steps: int = Field(30, ge=0)
    output_dir: Path = Path("polar-train")
    runtime: str | None = Field(
        None, description="Runtime kind for tasks that name none (local, bubblewrap, ...)."
    )
    run_workers: int = Field(8, ge=1, description="Sessions running at once on the node.")
    threads: int | None = Field(None, ge=1, description="torch CPU threads.")
    kv_cache_mb: int = Field(
        256,
        ge=0,
        description="Bound of the engine's prefix KV cache in MiB (0 turns it off). A step's "
        "sessions share one prompt prefix that a few entries hold; the engine's own default "
        "(2 GiB) was the largest part of a training run's memory.",
    )
    tensorboard: bool = True
    tasks: TaskConfig = Field(default_factory=TaskConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
        return load_config(cls, path, what="training config")
