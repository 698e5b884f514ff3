"""Qwen Code (``qwen``): OpenAI Chat Completions, configured by env and ``~/.qwen/settings.json``.

Its settings switch off usage statistics, telemetry, auto-update and the managed memory agent,
which otherwise runs an extra model call per turn (and a periodic "dream" pass). Never give it
an HTTP(S) proxy: it ignores NO_PROXY and would send the gateway's traffic there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from polar.harnesses.base import (
    ConfigFileSettings,
    Harness,
    HarnessContext,
    HarnessLaunch,
    ShellTool,
    system_text,
)
from polar.providers.types import NormalizedRequest

_MEMORY_MARKERS = ("managed memory extraction subagent", "performing a managed memory dream")


class QwenCodeSettings(ConfigFileSettings):
    max_turns: int | None = Field(None, ge=1, description="--max-session-turns.")


class QwenCode(Harness):
    name = "qwen_code"
    shell_tool = ShellTool("run_shell_command", "command")
    settings_model = QwenCodeSettings
    npm_package = "@qwen-code/qwen-code"
    turn_limit_setting = "max_turns"
    needs_node = True
    binary = "node_modules/@qwen-code/qwen-code/cli.js"

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        settings = QwenCodeSettings.parse(ctx.settings, self.name)
        argv = [
            *self.command(ctx, settings),
            "--auth-type",
            "openai",
            "--yolo",
            "--model",
            ctx.model_name,
        ]
        if settings.max_turns is not None:
            argv += ["--max-session-turns", str(settings.max_turns)]
        # Qwen Code reads no prompt after "--": the instruction is the last positional.
        argv += [*settings.extra_args, ctx.instruction]
        own = {
            "OPENAI_BASE_URL": ctx.openai_url,
            "OPENAI_API_KEY": ctx.api_key,
            "OPENAI_MODEL": ctx.model_name,
        }
        config: dict[str, Any] = {
            "security": {"auth": {"selectedType": "openai"}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"enableAutoUpdate": False},
            "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False},
        }
        merged = settings.config_file(config, "mcpServers")
        files = {ctx.home_path(".qwen", "settings.json"): json.dumps(merged, indent=2)}
        return HarnessLaunch(
            argv=argv, env=self.environment(ctx, own), files=files, cwd=ctx.workdir
        )

    def side_call_tag(self, request: NormalizedRequest, headers: Mapping[str, str]) -> str | None:
        text = system_text(request)
        return "side_call:memory" if any(m in text for m in _MEMORY_MARKERS) else None
