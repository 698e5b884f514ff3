"""A harness is its module plus one registry line: registered, a toy preset is first-class in
the quickstart, generate (its plan and the demonstrator) and tool-use training, with no table
elsewhere to edit. Its facts (turn limit, compact settings, follow-ups, light) live on it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import Field

from polar.errors import ConfigError
from polar.harnesses.base import Harness, HarnessContext, HarnessLaunch, HarnessSettings, ShellTool
from polar.harnesses.registry import harness_for, harnesses
from polar.quickstart.tasks import load_suite, task_request, with_follow_ups
from polar.schemas.task import AgentSpec, RuntimeSpec
from polar.stack import demonstrator, plan
from polar.training.tool_use import tool_use


class ToySettings(HarnessSettings):
    turns: int | None = Field(None, ge=1)
    prompt: str | None = None
    follow_ups: list[str] = Field(default_factory=list)


class Toy(Harness):
    """A Python-only CLI (nothing to install), light, with a turn limit and a compact trim."""

    name = "toy"
    settings_model = ToySettings
    shell_tool = ShellTool("sh", "line")
    turn_limit_setting = "turns"
    compact_settings = {"prompt": "Be brief."}
    light = True

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        settings = ToySettings.parse(ctx.settings, self.name)
        argv = ["toy", str(settings.turns), ctx.instruction, *settings.follow_ups]
        return HarnessLaunch(argv=argv, env=self.environment(ctx, {}), cwd=ctx.workdir)


def _plan(stock_prompt: bool = False) -> plan.HarnessPlan:
    return plan.choose_harness(
        "toy", max_turns=4, model_name="m", stock_prompt=stock_prompt, echo=lambda line: None
    )


def _tool_use() -> list[Any]:
    return tool_use("train", 1, 2, harness="toy", runtime="local")


@pytest.fixture
def toy() -> Iterator[None]:
    harnesses.add(Toy.name, Toy)  # the one registry line
    yield
    harnesses.remove(Toy.name)


def test_an_unregistered_harness_is_refused_everywhere() -> None:
    with pytest.raises(ConfigError, match="unknown quickstart harness 'toy'"):
        _plan()
    with pytest.raises(ConfigError, match="names none"):
        demonstrator.shell_tool("toy")
    with pytest.raises(ConfigError, match="tool_use needs"):
        _tool_use()


@pytest.mark.usefixtures("toy")
def test_a_registered_toy_is_first_class_in_quickstart_generate_and_training() -> None:
    chosen = _plan()  # quickstart's and generate's plan: its own turn limit, its compact trim
    assert chosen.name == "toy" and chosen.binds == [] and not chosen.warnings
    assert chosen.agent.settings == {"prompt": "Be brief.", "turns": 4}
    assert chosen.agent.max_model_calls is None
    assert _plan(stock_prompt=True).agent.settings == {"turns": 4}
    harness_for(chosen.agent)  # its settings validate

    task = next(t for t in load_suite() if t.follow_ups)  # the suite's conversations
    followed = with_follow_ups(chosen.agent, task)
    assert followed.settings["follow_ups"] == task.follow_ups
    request = task_request(
        task, agent=chosen.agent, runtime=RuntimeSpec(kind="local"), num_samples=1,
        timeout_s=9, run_id="r",
    )  # fmt: skip
    assert request.agent.settings["follow_ups"] == task.follow_ups

    assert demonstrator.shell_tool("toy") == Toy.shell_tool  # generate --demonstrator

    tasks = _tool_use()  # tool-use training: its compact settings by default
    assert [t.agent.harness for t in tasks] == ["toy", "toy"]
    assert all(t.agent.settings == {"prompt": "Be brief."} for t in tasks)


def test_a_harness_without_its_own_turn_limit_gets_the_gateways() -> None:
    class Capless(Toy):
        turn_limit_setting = None

    spec = Capless().agent_spec(max_turns=3, model_name="m", compact=False)
    assert spec == AgentSpec(harness="toy", model_name="m", settings={}, max_model_calls=3)
