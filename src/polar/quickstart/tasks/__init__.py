"""The quickstart's bundled task suite (``suite.yaml``) and the TaskRequests made from it.

A suite task is deliberately tiny: an instruction, a few starting files, and a bash check run
in the workspace once the agent is done, with the agent's last reply at hand (see
:mod:`polar.quickstart.tasks.checker`), plus a reference solution or answer that tests use to
prove the check right. The same
file format works for a user's own suite (``polar quickstart --suite my.yaml``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from polar.config_loader import load_config
from polar.errors import ConfigError
from polar.harnesses.registry import create_harness, local_presets
from polar.quickstart.tasks.checker import IMPORT_PATH as CHECKER
from polar.schemas.task import AgentSpec, BuilderSpec, EvaluatorSpec, RuntimeSpec, TaskRequest

BUNDLED_SUITE = Path(__file__).with_name("suite.yaml")
CHECK_TIMEOUT_S = 30.0


class SuiteTask(BaseModel):
    """One toy task: what to ask, what the workspace starts with, how to check the result."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    instruction: str = Field(min_length=1)
    follow_ups: list[str] = Field(
        default_factory=list,
        description="More user messages, each sent once the agent has answered the one before, "
        "in the same session (Pi and the bundled agent): a conversation whose model calls "
        "extend one context, so prefix merging joins them into one trace. The check sees the "
        "last reply.",
    )
    files: dict[str, str] = Field(default_factory=dict)
    check: str = Field(
        min_length=1,
        description="bash, run in the workspace with the agent's last reply in $FINAL_ANSWER; "
        "exit 0 passes.",
    )
    solution: str | None = Field(
        None, description="bash that solves the task (proves the check; never shown to agents)."
    )
    answer: str | None = Field(None, description="A right final reply (proves the check).")


class Suite(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: list[SuiteTask] = Field(min_length=1)


def load_suite(path: str | Path | None = None) -> list[SuiteTask]:
    """The tasks of ``path`` (default: the bundled suite); a malformed file is a ConfigError."""
    source = Path(path) if path is not None else BUNDLED_SUITE
    tasks = load_config(Suite, source, what="task suite").tasks
    ids = [t.id for t in tasks]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ConfigError(f"task suite {source} repeats task id(s): {', '.join(duplicates)}")
    return tasks


def task_request(
    task: SuiteTask,
    *,
    agent: AgentSpec,
    runtime: RuntimeSpec,
    num_samples: int,
    timeout_s: float,
    run_id: str,
) -> TaskRequest:
    """The TaskRequest for one suite task: prefix-merged trajectories, graded by its check.

    ``timeout_s`` bounds the harness's own time: the seconds its calls spend with the engine
    do not count, so a busy machine makes the run slower, never its sessions TIMEOUT."""
    runtime = runtime.model_copy(update={"files": {**runtime.files, **task.files}})
    agent = with_follow_ups(agent, task)
    metadata: dict[str, Any] = {"group_id": f"{run_id}/{task.id}", "suite_task": task.id}
    return TaskRequest(
        task_id=task.id,
        instruction=task.instruction,
        num_samples=num_samples,
        timeout_seconds=timeout_s,
        timeout_counts_model_time=False,
        runtime=runtime,
        agent=agent,
        builder=BuilderSpec(strategy="prefix_merging"),
        evaluator=EvaluatorSpec(
            strategy=CHECKER,
            config={"command": task.check, "timeout_s": CHECK_TIMEOUT_S},
        ),
        metadata=metadata,
    )


def with_follow_ups(agent: AgentSpec, task: SuiteTask) -> AgentSpec:
    """``agent`` set to send ``task``'s follow-up messages, where its harness takes them (Pi as
    more positional messages, the bundled agent as more arguments); any other harness takes
    one instruction, so a task with follow-ups is refused for it by name rather than cut short."""
    if not task.follow_ups:
        return agent
    name = agent.import_path or agent.harness
    if name and create_harness(name).takes_follow_ups():
        settings = {**agent.settings, "follow_ups": list(task.follow_ups)}
        return agent.model_copy(update={"settings": settings})
    able = [n for n in local_presets() if create_harness(n).takes_follow_ups()]
    raise ConfigError(
        f"task {task.id!r} has follow_ups, which only {', '.join(able)} can send "
        f"(harness {name!r} takes one instruction)"
    )
