"""The bundled Python agent as a harness preset: its name, its source file and its one tool.

The agent itself (:mod:`polar.harnesses.agent`) is a standard-library script run by the
``shell`` preset from its source file, bound read-only into the sandbox; this module says how
an :class:`~polar.schemas.task.AgentSpec` asks for it, so every command that offers it
(quickstart, generate, the demonstrator) names it the same way.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from polar.harnesses.base import ShellTool
from polar.schemas.task import AgentSpec

AGENT = "agent"
"""The name ``--harness`` takes for the bundled minimal Python agent."""
AGENT_PATH = Path(__file__).with_name("agent.py").absolute()
AGENT_SHELL_TOOL = ShellTool("shell", "command")
"""The bundled agent's one tool (``agent.TOOL``), as a model calls it."""


def agent_spec(max_turns: int, model_name: str) -> AgentSpec:
    """The bundled agent, run by the ``shell`` preset from its source file (bind
    :data:`AGENT_PATH` read-only where the runtime is a sandbox)."""
    command = f"python3 {shlex.quote(str(AGENT_PATH))} --max-turns {max_turns} {{instruction}}"
    return AgentSpec(harness="shell", model_name=model_name, settings={"command": command})
