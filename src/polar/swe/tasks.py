"""The TaskRequest for one SWE instance: its issue as the prompt, its repository as the
workspace, its tests as the grade.

On a laptop or in CI (``local``, ``bubblewrap``) the workspace is a host-side git checkout of
the instance's repository (a path or a ``git bundle`` from ``repos``) at ``base_commit``; in
production (``docker``, ``apptainer``) it is the ``/testbed`` of the instance's prebuilt image.
Either way the checkout happens at INIT, off the run path, and the ``swe_tests`` evaluator
grades in a fresh runtime with the agent's diff, so the agent never touches the grading tests.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from polar.errors import ConfigError
from polar.harnesses.install import default_prefix
from polar.harnesses.registry import CLI_PRESETS
from polar.runtimes.registry import binds_host_paths, needs_image, runtime_names
from polar.schemas.ids import MAX_ID_LENGTH
from polar.schemas.task import (
    AgentSpec,
    BuilderSpec,
    EvaluatorSpec,
    GitSource,
    ImageSource,
    RuntimeSpec,
    TaskRequest,
)
from polar.swe.images import DUNDER, image_name, with_registry
from polar.swe.instances import SWEInstance

EVALUATOR = "swe_tests"
# SWE-bench images keep the repository's environment in a conda env named testbed.
CONDA_PATH = (
    "/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:"
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)
INSTRUCTION = """\
The repository {repo} is checked out in your current working directory. Resolve the issue \
below by changing the repository's source code. Do not add, edit or delete tests: the \
project's tests grade your change.

<issue>
{problem_statement}
</issue>
"""

_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_HASH_CHARS = 8


class SWETaskOptions(BaseModel):
    """How SWE instances become tasks: where they run, which agent, which limits."""

    model_config = ConfigDict(extra="forbid")

    runtime: str = Field("bubblewrap", description="A registered runtime kind.")
    repos: dict[str, str] = Field(
        default_factory=dict,
        description="local/bubblewrap: repo name -> host path of its git repository or bundle.",
    )
    image_namespace: str = Field("swebench", description="docker/apptainer: image namespace.")
    image_registry: str | None = Field(None, description="A registry host to pull from.")
    image_tag: str = "latest"
    image_arch: str = "x86_64"
    image_dunder: str = Field(DUNDER, description="What '__' in an instance id becomes.")
    sif_dir: str | None = Field(
        None, description="apptainer: a directory of <image name>.sif files (else docker://)."
    )
    workdir: str | None = Field(
        None, description="Default: /workspace for local runtimes, /testbed for images."
    )
    harness: str = Field("pi", description="A harness preset, or module:Class.")
    model_name: str = "polar"
    settings: dict[str, Any] = Field(default_factory=dict, description="Harness settings.")
    agent_env: dict[str, str] = Field(default_factory=dict, description="The harness's env.")
    num_samples: int = Field(1, ge=1)
    timeout_s: float = Field(1800.0, gt=0, description="The whole session, evaluation included.")
    test_timeout_s: float = Field(900.0, gt=0, description="One run of the tests.")
    retries: int = Field(0, ge=0, description="Reruns of a failing test run (flaky tests).")
    env: dict[str, str] | None = Field(
        None, description="The runtime's env (default for images: the testbed conda PATH)."
    )
    test_cmd: str | None = Field(None, description="Overrides every instance's test command.")
    prepare: list[str] = Field(default_factory=list, description="Shell commands run at INIT.")
    ro_binds: list[str] = Field(
        default_factory=list,
        description="bubblewrap: read-only binds (default: the harness install, for a CLI preset).",
    )
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    instruction: str = Field(
        INSTRUCTION, description="The prompt, with {problem_statement}, {repo}, {instance_id}."
    )

    @field_validator("runtime")
    @classmethod
    def _known_runtime(cls, value: str) -> str:
        if value not in runtime_names():
            raise ValueError(f"runtime must be one of {', '.join(runtime_names())}")
        return value


def instance_task(
    instance: SWEInstance, options: SWETaskOptions, *, task_id: str | None = None
) -> TaskRequest:
    """The TaskRequest that asks an agent to resolve ``instance`` (``task_id`` defaults to the
    sanitized instance id)."""
    runtime = _runtime(instance, options)
    return TaskRequest(
        task_id=task_id or swe_task_id(instance.instance_id),
        instruction=options.instruction.format(
            problem_statement=instance.problem_statement.strip(),
            repo=instance.repo,
            instance_id=instance.instance_id,
        ),
        num_samples=options.num_samples,
        timeout_seconds=options.timeout_s,
        runtime=runtime,
        agent=_agent(options),
        builder=BuilderSpec(strategy="prefix_merging"),
        evaluator=EvaluatorSpec(
            strategy=EVALUATOR,
            refresh_runtime=True,
            config=swe_tests_config(instance, options),
            env=runtime.env,  # the tests run with the agent's PATH (the testbed env in images)
        ),
        metadata={
            "instance_id": instance.instance_id,
            "repo": instance.repo,
            "dataset": instance.variant,
        },
    )


def swe_tests_config(instance: SWEInstance, options: SWETaskOptions) -> dict[str, Any]:
    """The ``swe_tests`` evaluator's config for ``instance``."""
    return {
        "instance_id": instance.instance_id,
        "repo": instance.repo,
        "version": instance.version,
        "FAIL_TO_PASS": list(instance.FAIL_TO_PASS),
        "PASS_TO_PASS": list(instance.PASS_TO_PASS),
        "test_patch": instance.test_patch,
        "test_cmd": options.test_cmd or instance.test_cmd,
        "log_parser": instance.log_parser,
        "eval_type": instance.eval_type,
        "timeout_s": options.test_timeout_s,
        "retries": options.retries,
    }


def swe_task_id(instance_id: str) -> str:
    """``instance_id`` as a task id: unsafe characters become ``-``, and a short hash of the
    original is appended when anything changed, so distinct ids stay distinct, run after run."""
    safe = _ID_UNSAFE.sub("-", instance_id)
    if safe and safe[0] in "-_":
        safe = "x" + safe
    if safe == instance_id and len(safe) <= MAX_ID_LENGTH:
        return safe
    digest = hashlib.sha256(instance_id.encode()).hexdigest()[:_HASH_CHARS]
    return f"{safe[: MAX_ID_LENGTH - _HASH_CHARS - 1]}-{digest}"


def _agent(options: SWETaskOptions) -> AgentSpec:
    custom = ":" in options.harness
    return AgentSpec(
        harness=None if custom else options.harness,
        import_path=options.harness if custom else None,
        model_name=options.model_name,
        settings=options.settings,
        env=options.agent_env,
    )


def _runtime(instance: SWEInstance, options: SWETaskOptions) -> RuntimeSpec:
    image = needs_image(options.runtime)
    spec: dict[str, Any] = {
        "kind": options.runtime,
        "workdir": options.workdir or ("/testbed" if image else "/workspace"),
        "prepare": [
            step.format(instance_id=instance.instance_id, base_commit=instance.base_commit or "")
            for step in options.prepare
        ],
        "env": options.env if options.env is not None else ({"PATH": CONDA_PATH} if image else {}),
        "cpus": options.cpus,
        "memory_mb": options.memory_mb,
    }
    if image:
        spec["image"] = _image(instance, options)
        spec["source"] = ImageSource(kind="image")
    else:
        spec["source"] = GitSource(
            kind="git", repo=_repo_path(instance, options), commit=instance.base_commit
        )
        binds = options.ro_binds or _harness_binds(options)
        if binds_host_paths(options.runtime) and binds:
            spec["options"] = {"ro_binds": binds}
    return RuntimeSpec.model_validate(spec)


def _harness_binds(options: SWETaskOptions) -> list[str]:
    """A CLI preset runs from Polar's harness install, which a bubblewrap sandbox only sees
    when it is bound in: bind it unless the options say what to bind."""
    return [str(default_prefix())] if options.harness in CLI_PRESETS else []


def _image(instance: SWEInstance, options: SWETaskOptions) -> str:
    if instance.image_name:
        name = with_registry(instance.image_name, options.image_registry)
    else:
        name = image_name(
            instance.instance_id,
            namespace=options.image_namespace,
            arch=options.image_arch,
            tag=options.image_tag,
            registry=options.image_registry,
            dunder=options.image_dunder,
        )
    if options.runtime != "apptainer":
        return name
    if options.sif_dir:
        return str(Path(options.sif_dir) / (re.sub(r"[/:]", "_", name) + ".sif"))
    return f"docker://{name}"


def _repo_path(instance: SWEInstance, options: SWETaskOptions) -> str:
    if instance.repo not in options.repos:
        known = ", ".join(sorted(options.repos)) or "none"
        raise ConfigError(
            f"instance {instance.instance_id}: no local repository for {instance.repo} "
            f"(repos given: {known}); map it to a git repository or bundle, or run it in an "
            "image runtime (docker, apptainer)"
        )
    return str(Path(options.repos[instance.repo]).expanduser().resolve())
