"""The capture record: everything known about one model call, as stored durably."""

from __future__ import annotations

import secrets
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from polar.schemas.harness_ids import HarnessIds

# orjson encodes at most 254 nested levels (and parses 1,024). A record's body holds the
# harness's request one level down and the upstream request, which copies parts of it (tool
# schemas) a few levels deeper still, so a request may nest at most this deep to be storable.
_ENCODE_DEPTH = 254
MAX_REQUEST_DEPTH = 240


class CaptureRecord(BaseModel):
    """One model call as the gateway saw it (public: builders and exports read these)."""

    model_config = ConfigDict(extra="forbid")

    completion_id: str = Field(
        description="The gateway's id for the call (what the harness saw); unique in a store."
    )
    engine_completion_id: str | None = Field(
        default=None, description="The engine's own id for the call (engines may repeat them)."
    )
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
    harness_call_ids: list[str] = Field(
        default_factory=list,
        description="The id the harness was given for each call of `response`, in order: the "
        "model's own (as in `response`) unless the session had been given it already, then "
        "`<id>_<n>`, so no id reaches a harness twice (see gateway/call_ids.py).",
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
    harness_ids: HarnessIds | None = Field(
        default=None,
        description="The agent ids the harness CLI put on the request's headers (an allow-list "
        "of lineage headers; see capture/harness_ids.py), or None when it sent none.",
    )
    routed_experts: str | None = Field(
        default=None,
        description="MoE routing replay: the experts of every prompt token and every sampled "
        "token but the last, base64 .npy (positions, layers, top_k); see capture/routed_experts.",
    )

    @model_validator(mode="after")
    def _one_harness_id_per_call(self) -> CaptureRecord:
        calls, given = self.response.get("tool_calls") or [], self.harness_call_ids
        if given and len(given) != len(calls):
            raise ValueError(f"{len(given)} harness call ids for {len(calls)} tool calls")
        return self

    def call_id_pairs(self) -> list[tuple[str, str]]:
        """(the id the harness was given, the model's own) for each call of the reply."""
        calls = self.response.get("tool_calls") or []
        # No harness ids (a record from before them, or no calls): no pairs.
        return [(g, str(c.get("id"))) for g, c in zip(self.harness_call_ids, calls, strict=False)]


def new_completion_id() -> str:
    """A gateway completion id: 96 random bits, so no two calls of any store share one."""
    return "chatcmpl-" + secrets.token_hex(12)


def within_request_depth(value: Any) -> bool:
    """Whether ``value`` nests at most :data:`MAX_REQUEST_DEPTH` levels, so its record encodes.

    orjson itself does the counting (in C, ~0.01 ms for an 80 KB body): ``value`` wrapped in
    the levels a request may not use must still encode.
    """
    wrapped = value
    for _ in range(_ENCODE_DEPTH - MAX_REQUEST_DEPTH):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except orjson.JSONEncodeError as exc:
        if "recursion" in str(exc).lower():
            return False
        raise
    return True
