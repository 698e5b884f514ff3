"""Trace and Trajectory: the training data a session produces (public wire contract)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TrajectoryStatus(StrEnum):
    COMPLETED = "COMPLETED"
    TIMEOUT = "TIMEOUT"
    ERROR = "ERROR"


class Trace(BaseModel):
    """One trainable sequence: a prompt, and a response with a loss mask over it."""

    model_config = ConfigDict(extra="forbid")

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int] = Field(description="0/1 per response token; 1 = sampled, trainable.")
    response_logprobs: list[float] | None = Field(
        default=None, description="Per response token; null when any trainable token lacks one."
    )
    prompt_messages: list[dict[str, Any]] = Field(default_factory=list)
    response_messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    finish_reason: str | None = None
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _lengths_agree(self) -> Trace:
        n = len(self.response_ids)
        if len(self.loss_mask) != n:
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries for {n} response ids")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask entries must be 0 or 1")
        if self.response_logprobs is not None and len(self.response_logprobs) != n:
            raise ValueError(
                f"response_logprobs has {len(self.response_logprobs)} entries for {n} response ids"
            )
        return self


class Trajectory(BaseModel):
    """All traces of one session, with how the session ended."""

    model_config = ConfigDict(extra="forbid")

    status: TrajectoryStatus
    traces: list[Trace] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
