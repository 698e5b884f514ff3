"""Gemini CLI (``gemini -p``): Google streamGenerateContent, configured by env and
``~/.gemini/settings.json``.

The settings file must pick API-key auth (else it exits 41). An untrusted folder silently turns
``--yolo`` off, so the workspace is trusted by env. Naming the model (``-m``) skips the routing
call; the next-speaker check and the LLM loop detector are switched off too. What side calls
remain (history compression on long sessions) are recognised by their system prompts.
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

_SIDE_CALL_MARKERS = (
    ("Task Routing AI", "side_call:routing"),
    ("determines whether a conversational AI assistant is stuck", "side_call:loop_detection"),
    ("distilling chat history into a structured XML", "side_call:compression"),
)


class GeminiCliSettings(ConfigFileSettings):
    max_turns: int | None = Field(None, ge=1, description="model.maxSessionTurns.")


class GeminiCli(Harness):
    name = "gemini_cli"
    shell_tool = ShellTool("run_shell_command", "command")
    settings_model = GeminiCliSettings
    npm_package = "@google/gemini-cli"
    turn_limit_setting = "max_turns"
    needs_node = True
    binary = "node_modules/@google/gemini-cli/bundle/gemini.js"

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        settings = GeminiCliSettings.parse(ctx.settings, self.name)
        argv = [
            *self.command(ctx, settings),
            "--yolo",
            "--model",
            ctx.model_name,
            *settings.extra_args,
            "--prompt",
            ctx.instruction,
        ]
        own = {
            "GOOGLE_GEMINI_BASE_URL": ctx.session_url,
            "GEMINI_API_KEY": ctx.api_key,
            "GEMINI_MODEL": ctx.model_name,
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
        }
        model: dict[str, Any] = {"skipNextSpeakerCheck": True, "disableLoopDetection": True}
        if settings.max_turns is not None:
            model["maxSessionTurns"] = settings.max_turns
        config: dict[str, Any] = {
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
            "model": model,
        }
        merged = settings.config_file(config, "mcpServers")
        files = {ctx.home_path(".gemini", "settings.json"): json.dumps(merged, indent=2)}
        return HarnessLaunch(
            argv=argv, env=self.environment(ctx, own), files=files, cwd=ctx.workdir
        )

    def side_call_tag(self, request: NormalizedRequest, headers: Mapping[str, str]) -> str | None:
        text = system_text(request)
        return next((tag for marker, tag in _SIDE_CALL_MARKERS if marker in text), None)
