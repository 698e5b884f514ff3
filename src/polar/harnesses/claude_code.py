"""Claude Code (``claude -p``): Anthropic Messages, configured by environment variables.

The native binary from the platform package is run directly (the npm wrapper only works after
an install script, which Polar does not run). Every model alias, the small/fast model and the
sub-agent model are pinned to the run's model. Non-essential traffic, telemetry, error reports,
auto-update, auto-memory and the non-streaming retry are switched off, and the per-request
attribution line in the system prompt (which changes every call and breaks prefix merging) is
turned off at the source. As root, skipping permissions needs ``IS_SANDBOX=1``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from polar.harnesses.base import (
    Harness,
    HarnessContext,
    HarnessLaunch,
    HarnessSettings,
    ShellTool,
)
from polar.providers.types import NormalizedRequest

_MODEL_VARS = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
)
_QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_GROWTHBOOK": "1",
    "CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK": "1",
    "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
    "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "IS_SANDBOX": "1",
}


class ClaudeCodeSettings(HarnessSettings):
    max_turns: int | None = Field(None, ge=1, description="--max-turns.")
    reasoning_effort: Literal["low", "medium", "high", "xhigh", "max"] | None = Field(
        None, description="--effort."
    )
    mcp_servers: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="mcpServers entries as Claude Code reads them; only these are loaded.",
    )


class ClaudeCode(Harness):
    name = "claude_code"
    shell_tool = ShellTool("Bash", "command", {"description": "Run a shell command"})
    settings_model = ClaudeCodeSettings
    npm_package = "@anthropic-ai/claude-code"
    turn_limit_setting = "max_turns"
    binary = "node_modules/@anthropic-ai/claude-code-linux-x64/claude"

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        settings = ClaudeCodeSettings.parse(ctx.settings, self.name)
        config_dir = ctx.home_path(".claude")
        mcp_file = f"{config_dir}/polar-mcp.json"
        argv = [
            *self.command(ctx, settings),
            "-p",
            "--model",
            ctx.model_name,
            "--dangerously-skip-permissions",
            "--no-session-persistence",
            "--strict-mcp-config",
            "--mcp-config",
            mcp_file,
        ]
        if settings.max_turns is not None:
            argv += ["--max-turns", str(settings.max_turns)]
        if settings.reasoning_effort:
            argv += ["--effort", settings.reasoning_effort]
        argv += [*settings.extra_args, "--", ctx.instruction]
        own = {
            "ANTHROPIC_BASE_URL": ctx.session_url,
            "ANTHROPIC_API_KEY": ctx.api_key,
            "CLAUDE_CONFIG_DIR": config_dir,
            **dict.fromkeys(_MODEL_VARS, ctx.model_name),
            **_QUIET,
        }
        files = {mcp_file: json.dumps({"mcpServers": settings.mcp_servers}, indent=2)}
        return HarnessLaunch(
            argv=argv, env=self.environment(ctx, own), files=files, cwd=ctx.workdir
        )

    def side_call_tag(self, request: NormalizedRequest, headers: Mapping[str, str]) -> str | None:
        # Every agent turn streams; a non-streamed call is a retry or a helper query.
        return None if request.stream else "side_call:non_streaming"
