"""llm_judge: a model the gateway knows grades each turn against a rubric.

The judge sees the turn as text (the last user or tool message before it, the reply, and what
followed) and must answer with ``SCORE: <number>``; the number, scaled from ``[0, max_score]``
to ``[low, high]``, is the turn's reward. The call goes through the gateway's own engine and is
not captured, so judging never becomes training data. An answer without a score raises.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from polar.engines.base import Engine
from polar.errors import ConfigError, PolarError
from polar.providers.types import NormalizedRequest, SamplingParams
from polar.schemas.task import TurnRewardSpec
from polar.turn_rewards.base import Turn, TurnRewardHook, TurnScore, parse_config

SCORE = re.compile(r"SCORE:\s*(-?\d+(?:\.\d+)?)")
RUBRIC = (
    "You grade one step of an AI agent. Given the context, the agent's reply and what happened "
    "next, rate how much the step helped solve the task, from 0 (harmful or useless) to 10 "
    "(clearly right). End with a line 'SCORE: <number>'."
)


class LLMJudgeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    """The model to ask; unset: the model the session was served (the policy judges itself)."""
    rubric: str = RUBRIC
    max_score: float = 10.0
    low: float = -1.0
    high: float = 1.0
    max_tokens: int = 256
    temperature: float = 0.0


class JudgeError(PolarError):
    """The judge answered without a parseable score."""


class LLMJudge(TurnRewardHook):
    name = "llm_judge"

    def __init__(self, spec: TurnRewardSpec, engine: Engine | None = None) -> None:
        super().__init__(spec, engine)
        self.config = parse_config(LLMJudgeConfig, spec)
        if engine is None:
            raise ConfigError("turn reward 'llm_judge' needs the gateway's engine; none was given")
        self.judge = engine

    async def score(self, turn: Turn) -> TurnScore | None:
        cfg = self.config
        request = NormalizedRequest(
            provider="openai_chat",
            model=cfg.model or turn.call.model,
            messages=[
                {"role": "system", "content": cfg.rubric},
                {"role": "user", "content": _transcript(turn)},
            ],
            params=SamplingParams(max_tokens=cfg.max_tokens, temperature=cfg.temperature),
        )
        answer = (await self.judge.complete(request)).completion.content
        found = SCORE.findall(answer)
        if not found:
            raise JudgeError(f"judge answer has no 'SCORE: <number>': {answer[-200:]!r}")
        raw = min(max(float(found[-1]), 0.0), cfg.max_score)
        reward = cfg.low + (cfg.high - cfg.low) * raw / cfg.max_score
        return TurnScore(reward, {"judge_score": raw})


def _transcript(turn: Turn) -> str:
    before = turn.messages[-1:] if turn.messages else []
    parts = [f"## Context ({m.get('role')})\n{_text(m)}" for m in before]
    parts.append(f"## Agent reply\n{_text(turn.reply)}")
    parts += [f"## Then ({m.get('role')})\n{_text(m)}" for m in turn.results]
    return "\n\n".join(parts)


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content or "")
    calls = message.get("tool_calls")
    return text + (f"\n[tool calls] {json.dumps(calls)}" if calls else "")
