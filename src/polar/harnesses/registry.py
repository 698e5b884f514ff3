"""Harnesses by preset name, or by ``module:Class`` for custom ones."""

from __future__ import annotations

from collections.abc import Mapping

from polar.errors import ConfigError
from polar.harnesses.base import Harness
from polar.harnesses.bundled import BundledAgent
from polar.harnesses.claude_code import ClaudeCode
from polar.harnesses.codex import Codex
from polar.harnesses.gemini_cli import GeminiCli
from polar.harnesses.opencode import Opencode
from polar.harnesses.pi import Pi
from polar.harnesses.qwen_code import QwenCode
from polar.harnesses.shell import Shell
from polar.providers.types import NormalizedRequest
from polar.registry import Registry
from polar.schemas.task import AgentSpec

_PRESETS: tuple[type[Harness], ...] = (
    Codex,
    ClaudeCode,
    QwenCode,
    GeminiCli,
    Opencode,
    Pi,
    BundledAgent,
    Shell,
)

harnesses: Registry[Harness] = Registry("harness")
for _preset in _PRESETS:
    harnesses.add(_preset.name, _preset)

# The presets whose CLIs `polar harness install` installs.
CLI_PRESETS: tuple[str, ...] = tuple(sorted(p.name for p in _PRESETS if p.npm_package))


def local_presets() -> list[str]:
    """The registered presets a command can run with no settings of its own (quickstart,
    generate, tool-use training, the demonstrator): every CLI, the bundled agent, and a preset
    registered since, by name; not ``shell``, which needs its command."""
    return [name for name in harnesses.names() if create_harness(name).runs_unconfigured()]


def create_harness(name: str) -> Harness:
    """The harness for a preset name or ``module:Class``."""
    harness = harnesses.create(name)
    if not isinstance(harness, Harness):
        raise ConfigError(f"{name!r} is not a polar.harnesses.base.Harness")
    return harness


def harness_for(agent: AgentSpec) -> Harness:
    """The harness an AgentSpec names (``import_path`` wins over ``harness``)."""
    name = agent.import_path or agent.harness
    if not name:
        raise ConfigError("agent needs harness (a preset name) or import_path (module:Class)")
    harness = create_harness(name)
    harness.validate_settings(agent.settings)
    return harness


def side_call_tag(
    harness: str, request: NormalizedRequest, headers: Mapping[str, str]
) -> str | None:
    """The side-call tag for a request from a session running ``harness`` (None: agent turn)."""
    return create_harness(harness).side_call_tag(request, headers)
