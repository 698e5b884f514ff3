"""The scripted demonstrator: gold patches through each harness's own shell tool."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from polar.errors import ConfigError
from polar.harnesses.agent import TOOL
from polar.harnesses.bundled import AGENT, AGENT_SHELL_TOOL, BundledAgent
from polar.harnesses.registry import CLI_PRESETS
from polar.runtimes.checkouts import checkout
from polar.stack.demonstrator import (
    apply_command,
    demonstrator_script,
    marker,
    shell_tool,
)
from polar.swe.bundled import bundle_repos, bundled_instances


def test_the_bundled_agents_tool_is_the_one_its_source_declares() -> None:
    function = TOOL["function"]
    assert isinstance(function, dict)
    assert AGENT_SHELL_TOOL.name == function["name"]
    assert function["parameters"]["required"] == [AGENT_SHELL_TOOL.argument]
    assert shell_tool(AGENT) == AGENT_SHELL_TOOL == BundledAgent.shell_tool


@pytest.mark.parametrize("harness", CLI_PRESETS)
def test_every_cli_preset_can_be_demonstrated(harness: str) -> None:
    script = demonstrator_script(bundled_instances(), harness)
    for instance in bundled_instances():
        first = script.choose(f"system\n{instance.problem_statement}", 0)
        ((name, arguments),) = first.tool_calls
        assert name == shell_tool(harness).name
        assert instance.patch in arguments[shell_tool(harness).argument]
        assert script.choose(instance.problem_statement, 1).content
        assert not script.choose(instance.problem_statement, 1).tool_calls


def test_the_shell_preset_has_no_tool_to_drive() -> None:
    with pytest.raises(ConfigError, match="shell tool"):
        demonstrator_script(bundled_instances(), "shell")


def test_instances_without_gold_patches_or_with_the_delimiter_are_refused() -> None:
    bare = [i.model_copy(update={"patch": ""}) for i in bundled_instances()]
    with pytest.raises(ConfigError, match="no instance has a gold patch"):
        demonstrator_script(bare, "pi")
    with pytest.raises(ConfigError, match="delimiter"):
        apply_command("+POLAR_GOLD_PATCH\n")
    twins = [bundled_instances()[0], bundled_instances()[0].model_copy(update={"instance_id": "x"})]
    with pytest.raises(ConfigError, match="tell its sessions apart"):
        demonstrator_script(twins, "pi")


def test_the_command_applies_each_gold_patch_to_its_base_commit(tmp_path: Path) -> None:
    bundles = bundle_repos(tmp_path / "repos")
    for instance in bundled_instances():
        tree = checkout(str(bundles[instance.repo]), instance.base_commit, tmp_path / "cache")
        work = tmp_path / instance.instance_id
        subprocess.run(["cp", "-a", f"{tree}/.", str(work)], check=True)
        run = subprocess.run(
            ["bash", "-c", apply_command(instance.patch)],
            cwd=work,
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_GLOBAL": "/dev/null"},
        )
        assert run.returncode == 0, run.stderr
        assert "1 file changed" in run.stdout
        assert marker(instance) in instance.problem_statement
