"""Image names as SWE-bench spells them, and the TaskRequest an instance becomes per runtime."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from polar.errors import ConfigError
from polar.harnesses.install import default_prefix
from polar.schemas.ids import ID_PATTERN
from polar.schemas.task import TaskRequest
from polar.swe.images import image_name
from polar.swe.instances import SWEInstance
from polar.swe.tasks import CONDA_PATH, SWETaskOptions, instance_task, swe_task_id

from .records import GYM, SMITH, VERIFIED

IDS = ["astropy__astropy-12907", "django__django-11099", "sympy__sympy-20590", "psf__requests-863"]
CONFIG_KEYS = {
    "instance_id",
    "repo",
    "version",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "test_patch",
    "test_cmd",
    "log_parser",
    "eval_type",
    "timeout_s",
    "retries",
}


@pytest.mark.parametrize("instance_id", IDS)
def test_image_names_match_swebench(instance_id: str) -> None:
    checks = pytest.importorskip("swebench.task.checks")
    assert image_name(instance_id) == checks.expected_image(instance_id)
    assert image_name(instance_id, namespace="mirror") == checks.expected_image(
        instance_id, namespace="mirror"
    )


def test_image_names_take_a_registry_tag_arch_and_dunder() -> None:
    assert image_name("Django__django-1", registry="registry.local:5000/", tag="v2") == (
        "registry.local:5000/swebench/sweb.eval.x86_64.django_1776_django-1:v2"
    )
    assert image_name("a__b-1", arch="arm64") == "swebench/sweb.eval.arm64.a_1776_b-1:latest"
    assert image_name("a__b-1", arch="amd64") == "swebench/sweb.eval.x86_64.a_1776_b-1:latest"
    assert image_name("getmoto__moto-5752", namespace="xingyaoww", dunder="_s_") == (
        "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752:latest"
    )


def test_a_local_task_checks_out_the_repo_at_its_base_commit(tmp_path: Path) -> None:
    instance = SWEInstance.model_validate(VERIFIED)
    options = SWETaskOptions(
        repos={"astropy/astropy": str(tmp_path / "astropy.bundle")},
        ro_binds=["/opt/node"],
        harness="codex",
        settings={"reasoning_effort": "low"},
        num_samples=4,
        test_timeout_s=120,
        retries=2,
    )
    task = instance_task(instance, options)
    assert task.task_id == "astropy__astropy-12907"
    assert task.instruction.startswith("The repository astropy/astropy is checked out")
    assert "Do not add, edit or delete tests" in task.instruction
    assert "<issue>\nModeling's `separability_matrix`" in task.instruction
    runtime = task.runtime
    assert (runtime.kind, runtime.workdir, runtime.image, runtime.env) == (
        "bubblewrap",
        "/workspace",
        None,
        {},
    )
    assert runtime.source is not None
    assert runtime.source.model_dump() == {
        "kind": "git",
        "repo": str(tmp_path / "astropy.bundle"),
        "commit": VERIFIED["base_commit"],
    }
    assert runtime.options == {"ro_binds": ["/opt/node"]}
    assert (task.agent.harness, task.agent.settings) == ("codex", {"reasoning_effort": "low"})
    assert task.num_samples == 4
    assert task.builder.strategy == "prefix_merging"
    assert task.metadata == {
        "instance_id": "astropy__astropy-12907",
        "repo": "astropy/astropy",
        "dataset": "swe-bench",
    }
    evaluator = task.evaluator
    assert (evaluator.strategy, evaluator.refresh_runtime) == ("swe_tests", True)
    assert set(evaluator.config) == CONFIG_KEYS
    assert evaluator.config["FAIL_TO_PASS"] == instance.FAIL_TO_PASS
    assert evaluator.config["PASS_TO_PASS"] == instance.PASS_TO_PASS
    assert evaluator.config["test_patch"] == VERIFIED["test_patch"]
    assert (evaluator.config["timeout_s"], evaluator.config["retries"]) == (120, 2)
    assert evaluator.config["test_cmd"] is None
    # The YAML that `polar submit` reads comes back the same.
    assert TaskRequest.model_validate(task.model_dump(mode="json")) == task


def test_a_local_task_without_a_repo_for_its_instance_says_which(tmp_path: Path) -> None:
    instance = SWEInstance.model_validate(GYM)
    with pytest.raises(
        ConfigError, match=r"no local repository for getmoto/moto \(repos given: a/b\)"
    ):
        instance_task(instance, SWETaskOptions(runtime="local", repos={"a/b": str(tmp_path)}))


def test_a_docker_task_runs_in_the_instances_image_at_testbed() -> None:
    instance = SWEInstance.model_validate(GYM)
    options = SWETaskOptions(
        runtime="docker",
        image_namespace="xingyaoww",
        image_dunder="_s_",
        test_cmd="pytest -rA tests/test_ssm",
    )
    task = instance_task(instance, options)
    runtime = task.runtime
    assert runtime.kind == "docker"
    assert runtime.image == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752:latest"
    assert runtime.workdir == "/testbed"
    assert runtime.source is not None and runtime.source.kind == "image"
    assert runtime.env == task.evaluator.env == {"PATH": CONDA_PATH}
    assert task.evaluator.config["test_cmd"] == "pytest -rA tests/test_ssm"
    assert task.metadata["dataset"] == "swe-bench"


def test_a_smith_instances_own_image_wins_and_apptainer_pulls_or_reads_a_sif() -> None:
    instance = SWEInstance.model_validate(SMITH)
    docker = instance_task(instance, SWETaskOptions(runtime="docker", image_registry="mirror.io"))
    assert docker.runtime.image == f"mirror.io/{SMITH['image_name']}"
    assert docker.evaluator.config["test_patch"] == ""
    assert docker.metadata["dataset"] == "swe-smith"
    apptainer = instance_task(instance, SWETaskOptions(runtime="apptainer", env={"A": "1"}))
    assert apptainer.runtime.image == f"docker://{SMITH['image_name']}"
    assert apptainer.runtime.env == apptainer.evaluator.env == {"A": "1"}
    sif = instance_task(instance, SWETaskOptions(runtime="apptainer", sif_dir="/sif"))
    assert (
        sif.runtime.image == "/sif/jyangballin_swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536.sif"
    )


def test_a_custom_harness_prompt_and_prepare_steps() -> None:
    instance = SWEInstance.model_validate(SMITH)
    options = SWETaskOptions(
        runtime="docker",
        harness="my.agents:Agent",
        instruction="Fix {instance_id} in {repo}:\n{problem_statement}",
        prepare=["git checkout {instance_id}"],
    )
    task = instance_task(instance, options)
    assert (task.agent.harness, task.agent.import_path) == (None, "my.agents:Agent")
    assert task.instruction == (
        f"Fix {SMITH['instance_id']} in {SMITH['repo']}:\n{SMITH['problem_statement']}"
    )
    assert task.runtime.prepare == [f"git checkout {SMITH['instance_id']}"]


def test_options_are_strict() -> None:
    with pytest.raises(ValueError, match="harnes"):
        SWETaskOptions.model_validate({"harnes": "pi"})
    with pytest.raises(ValueError, match="runtime"):
        SWETaskOptions.model_validate({"runtime": "podman"})


@pytest.mark.parametrize(
    "instance_id",
    [
        "django__django-11099",
        "oauthlib__oauthlib.1fd52536.combine_file__09vlzwgc",
        "owner/repo#12",
        "_leading",
        "x" * 200,
        "ünïcode-1",
    ],
)
def test_task_ids_follow_the_id_grammar_stably_and_distinctly(instance_id: str) -> None:
    task_id = swe_task_id(instance_id)
    assert re.fullmatch(ID_PATTERN, task_id)
    assert swe_task_id(instance_id) == task_id
    assert (task_id == instance_id) == bool(re.fullmatch(ID_PATTERN, instance_id))


def test_sanitized_ids_keep_distinct_instances_distinct() -> None:
    assert swe_task_id("a.b") != swe_task_id("a/b") != swe_task_id("a-b")
    assert swe_task_id("a-b") == "a-b"
    assert swe_task_id("a.b").startswith("a-b-")
    assert len(swe_task_id("x" * 200)) == 128
    assert swe_task_id("x" * 200) != swe_task_id("x" * 199)


def test_a_cli_harness_in_bubblewrap_gets_the_harness_install_bound_in(tmp_path: Path) -> None:
    instance = SWEInstance.model_validate(VERIFIED)
    repos = {instance.repo: str(tmp_path / "repo.bundle")}
    pi = instance_task(instance, SWETaskOptions(runtime="bubblewrap", repos=repos))
    assert pi.runtime.options == {"ro_binds": [str(default_prefix())]}
    own = SWETaskOptions(runtime="bubblewrap", repos=repos, ro_binds=["/opt/node"])
    assert instance_task(instance, own).runtime.options == {"ro_binds": ["/opt/node"]}
    shell = SWETaskOptions(runtime="bubblewrap", repos=repos, harness="shell")
    assert instance_task(instance, shell).runtime.options == {}
    local = SWETaskOptions(runtime="local", repos=repos)
    assert instance_task(instance, local).runtime.options == {}
