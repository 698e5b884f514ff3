"""A bundled SWE task live in the docker runtime, on a task image built here the SWE-bench way.

The image is the test image plus the repository at ``/testbed`` (base commit checked out), named
by SWE-bench's scheme, built locally (nothing is pulled). The task is what ``instance_task``
makes for ``runtime="docker"``: the workspace is copied out of the image at INIT, the agent (the
bundled Python agent preset, which writes its own source in) fixes the bug with a shell tool call, and
``swe_tests`` grades a fresh container of the same image with the test patch applied.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from images.local_image import build_task_image, task_image_unready
from polar.runtimes.checkouts import checkout
from polar.stack.plan import agent_plan
from polar.swe.bundled import bundle_repos, bundled_instances
from polar.swe.tasks import SWETaskOptions, instance_task

from .swe_kit import FIX_TEXTKIT, MODEL, evaluation, run_tasks, scripted_backend, tool_output_seen

pytestmark = pytest.mark.slow

INSTANCE = "polar-bundled__textkit-1"


@pytest.fixture
def task_image(tmp_path: Path) -> Iterator[str]:
    if reason := task_image_unready():
        pytest.skip(reason)
    instance = next(i for i in bundled_instances() if i.instance_id == INSTANCE)
    bundle = bundle_repos(tmp_path / "repos")[instance.repo]
    tree = checkout(str(bundle), instance.base_commit, tmp_path / "checkouts")
    options = SWETaskOptions(runtime="docker")
    image = instance_task(instance, options).runtime.image
    assert image == "swebench/sweb.eval.x86_64.polar-bundled_1776_textkit-1:latest"
    build_task_image(image, tree)
    try:
        yield image
    finally:
        subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True)


def test_a_bundled_task_resolves_in_docker_from_its_swe_bench_image(
    tmp_path: Path, tokenizer: Any, task_image: str
) -> None:
    instance = next(i for i in bundled_instances() if i.instance_id == INSTANCE)
    agent = agent_plan(max_turns=3, model_name=MODEL).agent
    options = SWETaskOptions(
        runtime="docker",
        harness=agent.harness or "",
        model_name=MODEL,
        settings=agent.settings,
        timeout_s=240,
        test_timeout_s=120,
    )
    task = instance_task(instance, options)
    assert task.runtime.source is not None and task.runtime.source.kind == "image"
    assert task.runtime.workdir == "/testbed"

    backend = scripted_backend(tokenizer, ("shell", "command"), {INSTANCE: FIX_TEXTKIT})
    result = run_tasks(tmp_path / "run", backend, [task])[INSTANCE]

    graded = evaluation(result)
    assert graded["resolved"] is True, graded
    assert graded["applied"] == ["textkit/strings.py"]
    assert result.reward == 1.0
    # The agent worked in the image's repository: git inside saw its change.
    assert tool_output_seen(result, tokenizer, "textkit/strings.py")
    session_dir = Path(str(result.session_dir))
    assert (session_dir / "workspace" / ".git").is_dir()
