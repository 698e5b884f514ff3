"""An agent as its harness CLI named it on a call's request headers (read by
capture/harness_ids.py; kept on capture records and on the traces they make)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Cli = Literal["claude_code", "codex", "opencode"]


class HarnessIds(BaseModel):
    """One call's agent as its CLI named it on the request's headers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cli: Cli = Field(description="Whose header set this is.")
    agent: str = Field(description="The CLI's id of the agent making this call.")
    parent: str | None = Field(
        default=None, description="The CLI's id of the agent that spawned it (none: a root)."
    )
    session: str | None = Field(default=None, description="The CLI's session id, if it has one.")
    subagent: str | None = Field(
        default=None, description="Codex's x-openai-subagent: what kind of sub-agent it is."
    )
    headers: dict[str, str] = Field(
        default_factory=dict, description="The allow-listed headers as sent (lower-case names)."
    )

    @property
    def window(self) -> int | None:
        """Codex's context-window number, the ``N`` of ``x-codex-window-id: <thread>:<N>``: it
        goes up by one when the thread's history is compacted (None: not sent)."""
        thread, _, number = self.headers.get("x-codex-window-id", "").rpartition(":")
        return int(number) if thread and number.isdigit() else None
