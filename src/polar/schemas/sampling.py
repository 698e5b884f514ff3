"""The run's sampling policy: a contract the gateway imposes and the commands above it set.

It lives here, not in the gateway's config, so training, generation, the quickstart and the
Ray launcher can name a run's sampling without importing a server.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SamplingPolicy(BaseModel):
    """The run's sampling parameters, imposed on every call (harnesses mostly send none)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["override", "default"] = Field(
        "override",
        description="override: the run's values replace the client's; default: fill gaps only.",
    )
    temperature: float | None = Field(1.0, ge=0)
    top_p: float | None = Field(1.0, gt=0, le=1)
    top_k: int | None = None
    seed: int | None = None
    max_tokens: int | None = Field(
        None, gt=0, description="Cap on output tokens; larger client requests are clamped."
    )
