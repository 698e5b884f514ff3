"""The capture record: everything known about one model call, as stored durably."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class CaptureRecord(BaseModel):
    """One model call as the gateway saw it (public: builders and exports read these)."""

    model_config = ConfigDict(extra="forbid")

    completion_id: str
    session_id: str
    seq: int = 0
    provider: str
    model: str
    engine: str
    policy_version: int | None = None
    started_at: float
    finished_at: float
    request: dict[str, Any] | None = Field(
        default=None, description="The provider-native request body as the harness sent it."
    )
    upstream_request: dict[str, Any] = Field(
        description="The normalized chat-completions body sent to the engine."
    )
    response: dict[str, Any] = Field(
        description="The normalized completion as a chat-completions assistant message."
    )
    prompt_ids: list[int]
    sampled_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str
    sampling: dict[str, Any] = Field(default_factory=dict)
    flags: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list, description="e.g. 'side_call:title'.")
    dropped_tools: list[str] = Field(default_factory=list)
    notes: list[str] = Field(
        default_factory=list,
        description="What the adapter dropped or changed (stripped header lines, ignored items).",
    )
