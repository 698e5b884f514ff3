"""OpenAI Codex CLI (``codex exec``): OpenAI Responses, configured by ``$CODEX_HOME/config.toml``.

This version ignores ``OPENAI_BASE_URL``, so the gateway is a custom model provider in the
config file. Without the feature switches below it contacts its vendor's hosts at startup
(plugins, apps, update checks) and offers web search and sub-agents; off, the model sees plain
function tools only. Reasoning summaries are requested by the CLI itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from polar.harnesses.base import (
    API_KEY_VAR,
    ConfigFileSettings,
    Harness,
    HarnessContext,
    HarnessLaunch,
    ShellTool,
)

_PROVIDER = "polar"
# Features that reach the vendor's hosts or add non-function tools.
_FEATURES_OFF = ("plugins", "apps", "remote_plugin", "in_app_updates", "goals")
COMPACT_SETTINGS: dict[str, Any] = {
    "instructions": "You are a coding agent. Use the tools to work on files in the current "
    "directory.",
    "config": {
        "include_permissions_instructions": False,
        "include_apps_instructions": False,
        "include_environment_context": False,
        "skills": {"include_instructions": False, "bundled": {"enabled": False}},
        "features": {"view_image": False},
    },
}
"""Codex with a one-line base instructions file, no skills, permissions or environment
blocks and no view_image tool: ~1.2k SmolLM2 tokens of first prompt instead of ~5.8k, for a
small model on a CPU. exec_command (a ``cmd`` string), write_stdin and request_user_input stay:
this version has no switch for the last two."""


class CodexSettings(ConfigFileSettings):
    reasoning_effort: Literal["minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None, description="model_reasoning_effort."
    )
    instructions: str | None = Field(
        None,
        description="Base instructions in place of Codex's own (~17 KB): written to "
        "$CODEX_HOME/instructions.md and named by model_instructions_file.",
    )
    review: bool = Field(
        False,
        description="Run Codex's code review (`codex exec review`) instead of a task: the "
        "instruction is the review's own instructions, and Codex runs it as a review "
        "sub-agent (x-openai-subagent: review), a trace of that kind in the session tree.",
    )
    websocket: bool = Field(
        False,
        description="Responses over a WebSocket (the gateway provider's supports_websockets): "
        "one connection per session, each turn only its new input and previous_response_id.",
    )


class Codex(Harness):
    name = "codex"
    shell_tool = ShellTool("exec_command", "cmd")
    settings_model = CodexSettings
    npm_package = "@openai/codex"
    compact_settings = COMPACT_SETTINGS
    needs_node = True
    binary = "node_modules/@openai/codex/bin/codex.js"

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        settings = CodexSettings.parse(ctx.settings, self.name)
        codex_home = ctx.home_path(".codex")
        argv = [
            *self.command(ctx, settings),
            "exec",
            *(["review"] if settings.review else []),
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--ephemeral",
            *settings.extra_args,
            "--",
            ctx.instruction,
        ]
        env = self.environment(ctx, {"CODEX_HOME": codex_home})
        files = {f"{codex_home}/config.toml": toml_text(codex_config(ctx, settings))}
        if settings.instructions is not None:
            files[instructions_path(ctx)] = settings.instructions
        return HarnessLaunch(argv=argv, env=env, files=files, cwd=ctx.workdir)


def codex_config(ctx: HarnessContext, settings: CodexSettings) -> dict[str, Any]:
    """config.toml as data: the gateway as the only provider, every side channel off."""
    config: dict[str, Any] = {
        "model": ctx.model_name,
        "review_model": ctx.model_name,
        "model_provider": _PROVIDER,
        "approval_policy": "never",
        "sandbox_mode": "danger-full-access",
        "check_for_update_on_startup": False,
        "web_search": "disabled",
    }
    if settings.reasoning_effort:
        config["model_reasoning_effort"] = settings.reasoning_effort
    if settings.instructions is not None:
        config["model_instructions_file"] = instructions_path(ctx)
    config["analytics"] = {"enabled": False}
    config["history"] = {"persistence": "none"}
    config["features"] = dict.fromkeys(_FEATURES_OFF, False)
    config["agents"] = {"enabled": False}
    config["model_providers"] = {
        _PROVIDER: {
            "name": _PROVIDER,
            "base_url": ctx.openai_url,
            "env_key": API_KEY_VAR,
            "wire_api": "responses",
            **({"supports_websockets": True} if settings.websocket else {}),
        }
    }
    return settings.config_file(config, "mcp_servers")


def instructions_path(ctx: HarnessContext) -> str:
    return f"{ctx.home_path('.codex')}/instructions.md"


def toml_text(data: Mapping[str, Any]) -> str:
    """TOML for a config: top-level scalars, then one ``[table]`` per top-level dict.

    Deeper dicts become ``[a.b]`` tables too; lists hold scalars or inline tables.
    """
    lines: list[str] = []
    _emit_table(lines, (), data)
    return "\n".join(lines).lstrip("\n") + "\n"


def _emit_table(lines: list[str], path: tuple[str, ...], table: Mapping[str, Any]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, Mapping)}
    tables = {k: v for k, v in table.items() if isinstance(v, Mapping)}
    if path and (scalars or not tables):
        lines += ["", "[" + ".".join(_key(p) for p in path) + "]"]
    lines += [f"{_key(k)} = {_value(v)}" for k, v in scalars.items()]
    for key, sub in tables.items():
        _emit_table(lines, (*path, key), sub)


def _key(key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isalnum() and key.isascii()
    return key if bare else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")
