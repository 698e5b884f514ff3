"""Pi (``pi -p``): any of four wire APIs, configured by ``models.json`` in its agent dir.

Pi has no permission prompts and the smallest prompt of the six (four tools), which makes it
the best fit for a small local model. ``PI_OFFLINE=1`` stops its update check and telemetry.
One provider entry serves all four API modes; only the base URL differs, as each SDK joins
paths differently (Pi's Google client takes the version in the base URL). Pi has no MCP.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from polar.errors import HarnessError
from polar.harnesses.base import (
    API_KEY_VAR,
    Harness,
    HarnessContext,
    HarnessLaunch,
    HarnessSettings,
    ShellTool,
)

PiApi = Literal[
    "openai-completions", "openai-responses", "anthropic-messages", "google-generative-ai"
]
PI_APIS: tuple[str, ...] = (
    "openai-completions",
    "openai-responses",
    "anthropic-messages",
    "google-generative-ai",
)
_PROVIDER = "polar"
COMPACT_SETTINGS: dict[str, Any] = {
    "tools": ["bash", "write"],
    "extra_args": [
        "--system-prompt",
        "You are a coding agent. Use the tools to work on files in the current directory.",
    ],
}
"""Pi with a one-line system prompt and the two tools file work needs: ~0.4k SmolLM2 tokens
instead of the ~1.5k of its stock prompt and four tools, for a small model on a CPU."""


class PiSettings(HarnessSettings):
    api: PiApi = Field("openai-completions", description="The wire API Pi speaks.")
    thinking: Literal["off", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None, description="--thinking (the model entry is then marked reasoning-capable)."
    )
    tools: list[str] | None = Field(None, description="--tools allowlist (read,bash,edit,write).")
    model_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra fields of the models.json model entry (contextWindow, maxTokens, ...).",
    )
    compat: dict[str, Any] = Field(
        default_factory=dict, description="The provider's compat flags (openai-completions)."
    )
    follow_ups: list[str] = Field(
        default_factory=list,
        description="More user messages after the instruction, each sent once Pi has finished "
        "the one before, in the same session (Pi's print mode takes several messages): a "
        "multi-turn conversation whose calls extend one context.",
    )


class Pi(Harness):
    name = "pi"
    shell_tool = ShellTool("bash", "command")
    settings_model = PiSettings
    npm_package = "@mariozechner/pi-coding-agent"
    compact_settings = COMPACT_SETTINGS
    light = True
    needs_node = True
    binary = "node_modules/@mariozechner/pi-coding-agent/dist/cli.js"

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        settings = PiSettings.parse(ctx.settings, self.name)
        agent_dir = ctx.home_path(".pi", "agent")
        argv = [
            *self.command(ctx, settings),
            "--print",
            "--no-session",
            "--model",
            f"{_PROVIDER}/{ctx.model_name}",
        ]
        if settings.thinking:
            argv += ["--thinking", settings.thinking]
        if settings.tools is not None:
            argv += ["--tools", ",".join(settings.tools)]
        # Pi's parser rejects "--": the instruction and its follow-ups are the last positional
        # arguments, so a follow-up starting with "-" would be read as an option.
        if any(m.startswith("-") for m in settings.follow_ups):
            raise HarnessError("pi reads a follow-up starting with '-' as an option: reword it")
        argv += [*settings.extra_args, ctx.instruction, *settings.follow_ups]
        own = {"PI_CODING_AGENT_DIR": agent_dir, "PI_OFFLINE": "1"}
        files = {f"{agent_dir}/models.json": json.dumps(pi_models(ctx, settings), indent=2)}
        return HarnessLaunch(
            argv=argv, env=self.environment(ctx, own), files=files, cwd=ctx.workdir
        )


def pi_base_url(ctx: HarnessContext, api: str) -> str:
    """Where Pi's client for ``api`` must point to land on the session's routes."""
    if api == "anthropic-messages":
        return ctx.session_url
    if api == "google-generative-ai":
        return f"{ctx.session_url}/v1beta"
    return ctx.openai_url


def pi_models(ctx: HarnessContext, settings: PiSettings) -> dict[str, Any]:
    """models.json: one provider, the gateway, with the run's model as its only model."""
    model: dict[str, Any] = {"id": ctx.model_name}
    if settings.thinking and settings.thinking != "off":
        model["reasoning"] = True
    model.update(settings.model_options)
    provider: dict[str, Any] = {
        "baseUrl": pi_base_url(ctx, settings.api),
        "api": settings.api,
        "apiKey": API_KEY_VAR,
        "models": [model],
    }
    if settings.compat:
        provider["compat"] = settings.compat
    return {"providers": {_PROVIDER: provider}}
