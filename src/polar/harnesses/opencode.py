"""opencode (``opencode run``): OpenAI Chat Completions through ``@ai-sdk/openai-compatible``,
configured by ``OPENCODE_CONFIG_CONTENT``.

The native binary from the platform package is run directly (the npm wrapper needs an install
script). On an x86-64 CPU without AVX2, point ``settings.executable`` at the
``opencode-linux-x64-baseline`` binary. Without ``--title`` it makes an extra title call;
model fetches, auto-update, LSP downloads and default plugins are switched off by env. It may
still try a background plugin install, which fails harmlessly without a network.
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
    system_text,
)
from polar.providers.types import NormalizedRequest

_PROVIDER = "polar"
_QUIET = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
}
_TITLE_MARKER = "You are a title generator"


class OpencodeSettings(ConfigFileSettings):
    title: str = Field("polar", min_length=1, description="--title (skips the title call).")
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = Field(
        None, description="The model's reasoningEffort option (sent as reasoning_effort)."
    )


class Opencode(Harness):
    name = "opencode"
    shell_tool = ShellTool("bash", "command", {"description": "Run a shell command"})
    settings_model = OpencodeSettings
    npm_package = "opencode-ai"
    binary = "node_modules/opencode-linux-x64/bin/opencode"

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        settings = OpencodeSettings.parse(ctx.settings, self.name)
        model_ref = f"{_PROVIDER}/{ctx.model_name}"
        argv = [
            *self.command(ctx, settings),
            "run",
            "--pure",
            "--title",
            settings.title,
            "--model",
            model_ref,
            *settings.extra_args,
            "--",
            ctx.instruction,
        ]
        config = json.dumps(opencode_config(ctx, settings), separators=(",", ":"))
        own = {"OPENCODE_CONFIG_CONTENT": config, **_QUIET}
        return HarnessLaunch(argv=argv, env=self.environment(ctx, own), cwd=ctx.workdir)

    def side_call_tag(self, request: NormalizedRequest, headers: Mapping[str, str]) -> str | None:
        return "side_call:title" if _TITLE_MARKER in system_text(request) else None


def opencode_config(ctx: HarnessContext, settings: OpencodeSettings) -> dict[str, Any]:
    """The gateway as the only provider, its one model as main and small model, tools allowed."""
    model: dict[str, Any] = {"name": ctx.model_name}
    if settings.reasoning_effort:
        model["options"] = {"reasoningEffort": settings.reasoning_effort}
    model_ref = f"{_PROVIDER}/{ctx.model_name}"
    config: dict[str, Any] = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            _PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": _PROVIDER,
                "options": {"baseURL": ctx.openai_url, "apiKey": f"{{env:{API_KEY_VAR}}}"},
                "models": {ctx.model_name: model},
            }
        },
        "model": model_ref,
        "small_model": model_ref,
        "permission": "allow",
        "autoupdate": False,
        "share": "disabled",
    }
    return settings.config_file(config, "mcp")
