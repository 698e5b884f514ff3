"""process_reward: a process reward model behind an HTTP endpoint scores each turn.

POSTs ``{"messages": [...prompt, reply, ...what followed], "turn_index": i}`` (``turn_index``:
where the scored reply sits) to ``url`` and reads a number at ``field`` of the JSON answer. An
endpoint failure raises: a turn is never silently scored 0.
"""

from __future__ import annotations

import httpx
from pydantic import BaseModel, ConfigDict

from polar.engines.base import Engine
from polar.errors import PolarError
from polar.schemas.task import TurnRewardSpec
from polar.turn_rewards.base import Turn, TurnRewardHook, TurnScore, parse_config


class ProcessRewardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str
    field: str = "reward"
    timeout_s: float = 60.0
    headers: dict[str, str] = {}


class ProcessRewardError(PolarError):
    """The reward endpoint failed or answered without a number."""


class ProcessRewardModel(TurnRewardHook):
    name = "process_reward"

    def __init__(self, spec: TurnRewardSpec, engine: Engine | None = None) -> None:
        super().__init__(spec, engine)
        self.config = parse_config(ProcessRewardConfig, spec)
        self.client = httpx.AsyncClient(timeout=self.config.timeout_s, headers=self.config.headers)

    async def score(self, turn: Turn) -> TurnScore | None:
        messages = [*turn.messages, turn.reply, *turn.results]
        body = {"messages": messages, "turn_index": len(turn.messages)}
        try:
            answer = await self.client.post(self.config.url, json=body)
            answer.raise_for_status()
            value = answer.json()[self.config.field]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise ProcessRewardError(f"process reward at {self.config.url}: {exc}") from exc
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ProcessRewardError(f"{self.config.field!r} is not a number: {value!r}")
        return TurnScore(float(value), {"url": self.config.url})

    async def aclose(self) -> None:
        await self.client.aclose()
