"""tool_errors: a rule-based verifier: a tool call whose result reports a failure scores negative.

A turn that made tool calls is scored from the tool results the next request carries: any result
matching an error pattern (a non-zero exit, a traceback, Anthropic's ``is_error`` results, which
the adapter prefixes with ``Error:``) gives ``failure``, otherwise ``success``. Turns without tool
calls, and calls nothing followed, are left unscored.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from polar.engines.base import Engine
from polar.schemas.task import TurnRewardSpec
from polar.trajectory.messages import content_text
from polar.turn_rewards.base import Turn, TurnRewardHook, TurnScore, parse_config

DEFAULT_PATTERNS = [
    r"^Error:",
    # "exit code 2", "exit_code=1", "exit status 1", Pi's "Command exited with code 1", the
    # bundled agent's "[exit 1]"
    r"\bexit(?:ed with)?(?: code| status|_code)?[\s:=]*[1-9]\d*",
    r"Traceback \(most recent call last\)",
    r"command not found",
]


class ToolErrorsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    patterns: list[str] = Field(default_factory=lambda: list(DEFAULT_PATTERNS))
    failure: float = -1.0
    success: float = 0.0


class ToolErrors(TurnRewardHook):
    name = "tool_errors"

    def __init__(self, spec: TurnRewardSpec, engine: Engine | None = None) -> None:
        super().__init__(spec, engine)
        self.config = parse_config(ToolErrorsConfig, spec)
        self.patterns = [re.compile(p, re.MULTILINE) for p in self.config.patterns]

    async def score(self, turn: Turn) -> TurnScore | None:
        if not turn.reply.get("tool_calls") or turn.following is None:
            return None
        results = [m for m in turn.results if m.get("role") == "tool"]
        if not results:
            return None
        failed = [
            str(m.get("tool_call_id") or i)
            for i, m in enumerate(results)
            if any(p.search(content_text(m.get("content"))) for p in self.patterns)
        ]
        reward = self.config.failure if failed else self.config.success
        return TurnScore(reward, {"failed_tool_calls": failed, "tool_results": len(results)})
