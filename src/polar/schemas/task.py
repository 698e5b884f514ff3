"""TaskRequest and what comes back for it: the rollout service's public contract."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from polar.schemas.ids import NodeId, SessionId, TaskId
from polar.schemas.token_delivery import TokenDelivery, settle
from polar.schemas.trajectory import Trajectory


class GitSource(BaseModel):
    """A workspace that starts as ``repo`` (a host path of a git repository or a ``git bundle``
    file) with ``commit`` checked out: made on the host (no git needed inside the sandbox) and
    kept as a cached checkout, so thousands of sessions copy it instead of cloning."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["git"]
    repo: str = Field(min_length=1, description="Host path of a repository or bundle.")
    commit: str | None = Field(None, description="The commit checked out (default HEAD).")


class ImageSource(BaseModel):
    """A workspace that starts as the directory ``path`` of the runtime's image (default: the
    workdir), copied out before the workspace mount hides it, as a SWE-bench image's
    ``/testbed``."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["image"]
    path: str | None = Field(None, description="Directory copied (default: the workdir).")


WorkspaceSource = Annotated[GitSource | ImageSource, Field(discriminator="kind")]
"""Where a workspace's starting tree comes from, laid down at INIT before ``files``."""


class RuntimeSpec(BaseModel):
    """Where a harness runs: which runtime, which image or root, limits and prepare steps."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(
        "bubblewrap", description="local, bubblewrap, docker, apptainer, or module:Class."
    )
    image: str | None = Field(None, description="Container image (docker/apptainer).")
    workdir: str = Field(
        "/workspace", description="The harness's working directory inside the runtime."
    )
    source: WorkspaceSource | None = Field(
        None, description="The workspace's starting tree (a git checkout, or the image's)."
    )
    files: dict[str, str] = Field(
        default_factory=dict, description="Files to create in the workdir: path -> content."
    )
    prepare: list[str] = Field(default_factory=list, description="Shell commands run during INIT.")
    env: dict[str, str] = Field(default_factory=dict)
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    network: str = Field("gateway", description="gateway (loopback only) or host.")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Runtime-specific options, checked when the runtime is built: an unknown "
        "key is an error naming the runtime and the keys it takes.",
    )


class AgentSpec(BaseModel):
    """Which harness runs the task, against which model name, with which settings."""

    model_config = ConfigDict(extra="forbid")

    harness: str | None = Field(
        "shell",
        description="Preset name (codex, claude_code, qwen_code, gemini_cli, opencode, pi, shell).",
    )
    import_path: str | None = Field(
        None, description="module:Class of a custom harness (instead of harness)."
    )
    model_name: str = Field("polar", description="Model name the harness is configured with.")
    settings: dict[str, Any] = Field(default_factory=dict, description="Preset-specific settings.")
    env: dict[str, str] = Field(default_factory=dict)
    max_model_calls: int | None = Field(
        None,
        ge=1,
        le=1_000_000,  # stored as a SQLite integer: an unbounded one overflowed it (a 500)
        description="A turn limit the gateway enforces for any harness: call N+1 is refused "
        "with an error in the harness's provider format and the session ends as TIMEOUT, its "
        "partial trace kept and evaluated.",
    )


class StrategySpec(BaseModel):
    """A pluggable strategy by name or module:Class, with its config."""

    model_config = ConfigDict(extra="forbid")

    strategy: str
    config: dict[str, Any] = Field(default_factory=dict)


class EvaluatorSpec(StrategySpec):
    strategy: str = "session_completed"
    env: dict[str, str] = Field(default_factory=dict)
    refresh_runtime: bool = Field(
        False, description="Evaluate in a fresh runtime with the agent's diff applied."
    )
    timeout_seconds: float = Field(
        7200.0,
        gt=0,
        description="The time bound of POST-RUN (build the trajectory, evaluate, tear down), "
        "apart from the session's timeout_seconds. Past it the session ends ERROR "
        "(evaluator_timeout while evaluating, else postrun_timeout) and frees its worker.",
    )


class BuilderSpec(StrategySpec):
    strategy: str = "prefix_merging"


class TurnRewardSpec(StrategySpec):
    """A per-turn reward hook (``tool_errors``, ``llm_judge``, ``process_reward`` or module:Class)."""


class TaskRequest(BaseModel):
    """One task, expanded into ``num_samples`` sessions."""

    model_config = ConfigDict(extra="forbid")

    task_id: TaskId
    instruction: str
    num_samples: int = Field(1, ge=1)
    timeout_seconds: float = Field(600.0, gt=0)
    timeout_counts_model_time: bool = Field(
        True,
        description="Whether the time the session's model calls spend with the gateway "
        "(waiting for the engine or its model to load, generating) counts against "
        "timeout_seconds. False: the budget bounds the harness's own time, so a slow or "
        "shared engine makes sessions slower, never TIMEOUT; each call is bounded by its "
        "max_tokens instead, and their number by agent.max_model_calls.",
    )
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    agent: AgentSpec = Field(default_factory=AgentSpec)
    builder: BuilderSpec = Field(default_factory=BuilderSpec)
    evaluator: EvaluatorSpec = Field(default_factory=EvaluatorSpec)
    turn_rewards: list[TurnRewardSpec] = Field(
        default_factory=list,
        description="Hooks that score each model call from what followed it (per-turn rewards).",
    )
    callback_url: str | None = None
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="group_id, policy_version, rollout_step are lifted into trajectory metadata.",
    )


class SessionStatus(StrEnum):
    REGISTERED = "REGISTERED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    RUNNING = "RUNNING"
    POST_RUN = "POST_RUN"
    BUILDING = "BUILDING"
    EVALUATING = "EVALUATING"
    COMPLETED = "COMPLETED"
    ERROR = "ERROR"
    TIMEOUT = "TIMEOUT"

    @property
    def finished(self) -> bool:
        """COMPLETED, ERROR or TIMEOUT: the session will not change again."""
        return self in _FINAL_SESSION


_FINAL_SESSION = frozenset({SessionStatus.COMPLETED, SessionStatus.ERROR, SessionStatus.TIMEOUT})


class TaskStatus(StrEnum):
    """A task is RUNNING until every one of its sessions is final, then COMPLETED."""

    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"

    @property
    def final(self) -> bool:
        return self is TaskStatus.COMPLETED


FailureKind = Literal["infra", "agent", "evaluator", "timeout"]


class SessionFailure(BaseModel):
    """Why a session did not complete, in a form a trainer can act on.

    ``infra`` failures (node lost or restarted, runtime failed to start, drain deadline,
    cancellation) say nothing about the policy: trainers drop them from GRPO groups instead of
    scoring them 0. ``agent`` is the harness failing, ``evaluator`` the grader raising,
    ``timeout`` the session's budget running out.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: FailureKind
    reason: str = Field(
        "",
        description="A short snake_case cause (cancelled, runtime_start_failed, harness_failed, "
        "evaluator_failed, budget_exhausted, node_dead, ...); the result's error has the details.",
    )


class EvaluationSummary(BaseModel):
    """What the session's evaluator said: its verdict and its own details (``swe_tests``'s
    ``resolved``, a test command's output, ...)."""

    model_config = ConfigDict(extra="forbid")

    verdict: bool | None = Field(
        None, description="The evaluator's pass/fail; None when it gave only a score."
    )
    details: dict[str, Any] = Field(default_factory=dict)


# Session facts older nodes and result files carry in ``metadata``; read into typed fields.
_LEGACY_FACTS = ("sample_index", "exit_code", "session_dir", "passed", "evaluation")


def _lift_legacy_facts(data: dict[str, Any]) -> dict[str, Any]:
    metadata = data.get("metadata")
    if not isinstance(metadata, dict) or not any(k in metadata for k in _LEGACY_FACTS):
        return data
    user = {k: v for k, v in metadata.items() if k not in _LEGACY_FACTS}
    lifted: dict[str, Any] = {**data, "metadata": user}
    for key in ("sample_index", "exit_code", "session_dir"):
        if key in metadata:
            lifted.setdefault(key, metadata[key])
    if "passed" in metadata or "evaluation" in metadata:
        details = metadata.get("evaluation")
        lifted.setdefault(
            "evaluation",
            {
                "verdict": metadata.get("passed"),
                "details": details if isinstance(details, dict) else {},
            },
        )
    return lifted


class SessionResult(BaseModel):
    """What a gateway node reports for one session (the callback payload).

    The session's facts are typed fields; ``metadata`` holds only the user's own keys.
    ``passed`` is the one verdict every reader uses (the trainer, SFT, ``polar generate``, the
    quickstart): see :meth:`passed`.
    """

    model_config = ConfigDict(extra="forbid")

    sample_index: int | None = Field(None, ge=0, description="Which of the task's samples.")
    exit_code: int | None = Field(None, description="The harness's exit code.")
    session_dir: str | None = Field(None, description="The session's directory on its node.")
    evaluation: EvaluationSummary | None = Field(
        None, description="The evaluator's summary; None when the session was not evaluated."
    )

    session_id: SessionId
    task_id: TaskId
    status: SessionStatus
    trajectory: Trajectory | None = None
    reward: float | None = None
    timing: dict[str, float] = Field(default_factory=dict, description="Seconds per stage.")
    node_id: NodeId | None = None
    error: str | None = None
    failure: SessionFailure | None = Field(
        None, description="Set when status is ERROR or TIMEOUT: the failure's kind and reason."
    )
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _legacy_metadata(cls, data: Any) -> Any:
        return _lift_legacy_facts(data) if isinstance(data, dict) else data

    @property
    def passed(self) -> bool:
        """The one rule: the session COMPLETED and its evaluator's verdict is pass; with no
        verdict (an evaluator that only scores), a positive reward. A failed or timed-out
        session never passed, whatever its evaluator said of the workspace it left."""
        if self.status != SessionStatus.COMPLETED:
            return False
        verdict = self.evaluation.verdict if self.evaluation is not None else None
        return verdict if verdict is not None else (self.reward or 0) > 0

    @property
    def delivery(self) -> TokenDelivery:
        """This session's sampled tokens: delivered to trainable traces, or lost by reason (the
        builder's count, settled by how the session ended; see schemas/token_delivery.py)."""
        built = self.trajectory.stats.delivery if self.trajectory is not None else None
        kind = self.failure.kind if self.failure is not None else None
        return settle(built, self.status.value, kind)


class TaskResult(BaseModel):
    """A task's status and the results of its finished sessions (GET /tasks/{id})."""

    model_config = ConfigDict(extra="forbid")

    task_id: TaskId
    status: TaskStatus
    results: list[SessionResult] = Field(default_factory=list)
    result_paths: list[str] = Field(default_factory=list)


def settle_failure(result: SessionResult, unknown: SessionFailure) -> SessionResult:
    """``result`` keeping the invariant: a final ERROR or TIMEOUT has a failure (where its
    sender gave none: ``unknown`` for ERROR, the budget for TIMEOUT), a COMPLETED one none."""
    if result.status == SessionStatus.COMPLETED:
        return result if result.failure is None else result.model_copy(update={"failure": None})
    if not result.status.finished or result.failure is not None:
        return result
    if result.status == SessionStatus.TIMEOUT:
        unknown = SessionFailure(kind="timeout", reason="budget_exhausted")
    return result.model_copy(update={"failure": unknown})
