"""``agent``: the bundled minimal Python agent as a harness preset, like the CLIs.

The agent itself (:mod:`polar.harnesses.agent`) is a standard-library script, so any
``python3`` in any runtime runs it: the preset writes its source into the session's home with
the launch's files (nothing to install, nothing to bind) and points ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY`` at the session. Quickstart, generate and the demonstrator all name it
``agent``; a task that runs it through ``shell`` with its own command still works as before.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from polar.harnesses.agent import DEFAULT_MAX_TURNS
from polar.harnesses.base import Harness, HarnessContext, HarnessLaunch, HarnessSettings, ShellTool
from polar.schemas.task import AgentSpec

AGENT = "agent"
"""The preset name of the bundled minimal Python agent."""
AGENT_PATH = Path(__file__).with_name("agent.py").absolute()
AGENT_SHELL_TOOL = ShellTool("shell", "command")
"""The bundled agent's one tool (``agent.TOOL``), as a model calls it."""


class AgentSettings(HarnessSettings):
    max_turns: int = Field(
        DEFAULT_MAX_TURNS, ge=1, description="The most model calls the agent makes in all."
    )
    follow_ups: list[str] = Field(
        default_factory=list,
        description="More user messages, each sent once the agent has answered the one before, "
        "in the same conversation.",
    )


class BundledAgent(Harness):
    name = AGENT
    settings_model = AgentSettings
    shell_tool = AGENT_SHELL_TOOL
    turn_limit_setting = "max_turns"
    light = True

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        settings = AgentSettings.parse(ctx.settings, self.name)
        script = ctx.home_path(".polar", "agent.py")
        argv = [
            settings.executable or "python3",
            *settings.extra_args,  # the interpreter's (the agent takes no other flags)
            script,
            "--max-turns",
            str(settings.max_turns),
            ctx.instruction,
            *settings.follow_ups,
        ]
        own = {
            "POLAR_MODEL": ctx.model_name,
            "OPENAI_BASE_URL": ctx.openai_url,
            "OPENAI_API_KEY": ctx.api_key,
        }
        files = {script: AGENT_PATH.read_text("utf-8")}
        return HarnessLaunch(
            argv=argv, env=self.environment(ctx, own), files=files, cwd=ctx.workdir
        )


def agent_spec(max_turns: int, model_name: str) -> AgentSpec:
    """An AgentSpec for the bundled agent, at most ``max_turns`` model calls."""
    return BundledAgent().agent_spec(max_turns=max_turns, model_name=model_name, compact=False)
