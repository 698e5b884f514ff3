"""Turn-reward hooks by name (or ``module:Class``), built from a :class:`TurnRewardSpec`."""

from __future__ import annotations

from polar.engines.base import Engine
from polar.registry import Registry
from polar.schemas.task import TurnRewardSpec
from polar.turn_rewards.base import TurnRewardHook
from polar.turn_rewards.llm_judge import LLMJudge
from polar.turn_rewards.process_reward import ProcessRewardModel
from polar.turn_rewards.tool_errors import ToolErrors

TURN_REWARDS: Registry[TurnRewardHook] = Registry("turn reward")
TURN_REWARDS.add(ToolErrors.name, ToolErrors)
TURN_REWARDS.add(LLMJudge.name, LLMJudge)
TURN_REWARDS.add(ProcessRewardModel.name, ProcessRewardModel)


def create_turn_reward(spec: TurnRewardSpec, engine: Engine | None = None) -> TurnRewardHook:
    """The hook ``spec.strategy`` names; ``engine`` is what an LLM judge samples from."""
    return TURN_REWARDS.create(spec.strategy, spec, engine)
