"""Finding harnesses: preset names, module:Class, and what an AgentSpec names."""

from __future__ import annotations

import pytest

from polar.errors import ConfigError
from polar.harnesses.base import Harness, HarnessContext, HarnessLaunch
from polar.harnesses.codex import toml_text
from polar.harnesses.registry import CLI_PRESETS, create_harness, harness_for, harnesses
from polar.schemas.task import AgentSpec


class EchoHarness(Harness):
    """A custom harness in under ten lines, loaded by module:Class."""

    name = "echo"

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        argv = ["echo", ctx.instruction]
        return HarnessLaunch(argv=argv, env=self.environment(ctx, {}), cwd=ctx.workdir)


def test_presets_are_registered() -> None:
    assert harnesses.names() == [
        "agent",
        "claude_code",
        "codex",
        "gemini_cli",
        "opencode",
        "pi",
        "qwen_code",
        "shell",
    ]
    assert CLI_PRESETS == ("claude_code", "codex", "gemini_cli", "opencode", "pi", "qwen_code")


def test_custom_harness_by_import_path() -> None:
    harness = harness_for(AgentSpec(harness=None, import_path=f"{__name__}:EchoHarness"))
    assert isinstance(harness, EchoHarness)


def test_import_path_that_is_not_a_harness_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"is not a polar\.harnesses\.base\.Harness"):
        create_harness("polar.schemas.task:AgentSpec")


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown harness 'codx'.*codex"):
        create_harness("codx")


def test_agent_spec_settings_are_validated_up_front() -> None:
    with pytest.raises(ConfigError, match="max_turns"):
        harness_for(AgentSpec(harness="claude_code", settings={"max_turns": "many"}))
    with pytest.raises(ConfigError, match="needs harness"):
        harness_for(AgentSpec(harness=None))


def test_toml_text_round_trips_nested_tables_and_odd_keys() -> None:
    import tomllib

    data = {
        "model": 'a "quoted" name',
        "n": 3,
        "ratio": 0.5,
        "on": True,
        "tags": ["x", "y"],
        "a": {"b": {"c": 1, "dotted.key": "v"}, "servers": [{"name": "s", "port": 1}]},
        "empty": {},
    }
    assert tomllib.loads(toml_text(data)) == data


@pytest.mark.parametrize("name", CLI_PRESETS)
def test_every_cli_preset_names_its_shell_tool(name: str) -> None:
    """Demonstrators and tests drive a real CLI through this tool (the live harness tests call
    it, so a wrong name fails there)."""
    tool = create_harness(name).shell_tool
    assert tool is not None
    tool_name, arguments = tool.call("ls -l")
    assert tool_name and arguments[tool.argument] == "ls -l"
    assert create_harness("shell").shell_tool is None
