"""``shell``: any command line, for harnesses without a preset.

``settings.command`` runs under ``bash -c`` with placeholders replaced: ``{instruction}`` (shell
quoted), ``{model}``, ``{api_key}``, ``{openai_base_url}``, ``{anthropic_base_url}``,
``{google_base_url}``. The same facts are in the environment under the names the official SDKs
read (``OPENAI_BASE_URL``, ``ANTHROPIC_BASE_URL``, ...), so most programs need no flags at all.
"""

from __future__ import annotations

import shlex

from pydantic import Field

from polar.harnesses.base import Harness, HarnessContext, HarnessLaunch, HarnessSettings


class ShellSettings(HarnessSettings):
    command: str = Field(
        min_length=1, description="The command line; {instruction} etc. are substituted."
    )


class Shell(Harness):
    name = "shell"
    settings_model = ShellSettings

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        settings = ShellSettings.parse(ctx.settings, self.name)
        values = {
            "instruction": shlex.quote(ctx.instruction),
            "model": ctx.model_name,
            "api_key": ctx.api_key,
            "openai_base_url": ctx.openai_url,
            "anthropic_base_url": ctx.session_url,
            "google_base_url": ctx.session_url,
        }
        command = settings.command
        for name, value in values.items():
            command = command.replace("{" + name + "}", value)
        shell = settings.executable or "bash"
        own = {
            "POLAR_INSTRUCTION": ctx.instruction,
            "POLAR_MODEL": ctx.model_name,
            "POLAR_BASE_URL": ctx.session_url,
            "OPENAI_BASE_URL": ctx.openai_url,
            "OPENAI_API_KEY": ctx.api_key,
            "ANTHROPIC_BASE_URL": ctx.session_url,
            "ANTHROPIC_API_KEY": ctx.api_key,
            "GOOGLE_GEMINI_BASE_URL": ctx.session_url,
            "GEMINI_API_KEY": ctx.api_key,
        }
        argv = [shell, *settings.extra_args, "-c", command]
        return HarnessLaunch(argv=argv, env=self.environment(ctx, own), cwd=ctx.workdir)
