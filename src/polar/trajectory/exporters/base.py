"""The exporter interface: trajectories in, one trainer-shaped row per trace out, and back.

Each target format lives in its own module. Every exporter can also read its rows back into
traces (``trace``), which is what the round-trip tests hold it to: nothing a trainer needs may
be lost on the way out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import orjson

from polar.capture import routed_experts
from polar.schemas.trajectory import Trace, Trajectory

# Trajectory-level facts copied into every row (under "session" in the format's free-form slot)
# so a trainer can group samples (GRPO) without the trajectory at hand.
SESSION_KEYS = ("session_id", "task_id", "group_id", "policy_version", "rollout_step")


class Exporter(ABC):
    """Converts traces to one trainer's sample shape; ``tokenizer`` fills text fields if given."""

    name: ClassVar[str]

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    @abstractmethod
    def row(self, trace: Trace, session: Mapping[str, Any]) -> dict[str, Any]:
        """One trace in the target shape; ``session`` is the trajectory-level context."""

    @abstractmethod
    def trace(self, row: Mapping[str, Any]) -> Trace:
        """The trace a row came from (the inverse of :meth:`row`)."""

    def rows(self, trajectories: Iterable[Trajectory]) -> Iterator[dict[str, Any]]:
        for trajectory in trajectories:
            session = session_context(trajectory)
            for trace in trajectory.traces:
                yield self.row(trace, session)

    def write(self, trajectories: Iterable[Trajectory], path: str | Path) -> int:
        """Write rows as JSON lines; returns how many were written."""
        count = 0
        with Path(path).open("wb") as f:
            for row in self.rows(trajectories):
                f.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
                count += 1
        return count

    def read(self, path: str | Path) -> Iterator[dict[str, Any]]:
        with Path(path).open("rb") as f:
            for line in f:
                if line.strip():
                    yield orjson.loads(line)

    def text(self, ids: list[int]) -> str:
        """Decoded text for formats that carry it; empty without a tokenizer."""
        return str(self.tokenizer.decode(ids)) if self.tokenizer is not None else ""


def session_context(trajectory: Trajectory) -> dict[str, Any]:
    context = trajectory.stats.model_dump(include=set(SESSION_KEYS), exclude_unset=True)
    context["status"] = trajectory.status.value
    return context


def routing_of(trace: Trace) -> list[Any] | None:
    """The trace's MoE routing (R3) as nested lists, (tokens - 1, layers, top_k); None without."""
    text = trace.stats.routed_experts
    return routed_experts.decode(text).tolist() if text is not None else None


def trace_extras(trace: Trace) -> dict[str, Any]:
    """The trace fields a trainer shape has no column for, kept in its free-form slot."""
    return {
        "prompt_messages": trace.prompt_messages,
        "response_messages": trace.response_messages,
        "tools": trace.tools,
        "finish_reason": trace.finish_reason,
        "metadata": trace.metadata,
        **credit_fields(trace),
    }


CREDIT_COLUMNS = ("lineage", "masked", "turn_rewards")


def credit_fields(trace: Trace) -> dict[str, Any]:
    """Lineage, mask reasons and per-turn rewards as JSON values (read back by trace_from)."""
    return {
        "lineage": trace.lineage.model_dump(mode="json") if trace.lineage else None,
        "masked": [span.model_dump(mode="json") for span in trace.masked],
        "turn_rewards": [turn.model_dump(mode="json") for turn in trace.turn_rewards],
    }


def trace_from(
    prompt_ids: list[int],
    response_ids: list[int],
    loss_mask: list[int],
    logprobs: list[float] | None,
    reward: float | None,
    extras: Mapping[str, Any],
) -> Trace:
    """A trace rebuilt from a row's token columns and its :func:`trace_extras`."""
    return Trace(
        prompt_ids=list(prompt_ids),
        response_ids=list(response_ids),
        loss_mask=list(loss_mask),
        response_logprobs=None if logprobs is None else list(logprobs),
        reward=reward,
        prompt_messages=list(extras.get("prompt_messages") or []),
        response_messages=list(extras.get("response_messages") or []),
        tools=list(extras.get("tools") or []),
        finish_reason=extras.get("finish_reason"),
        metadata=dict(extras.get("metadata") or {}),
        lineage=extras.get("lineage"),
        masked=list(extras.get("masked") or []),
        turn_rewards=list(extras.get("turn_rewards") or []),
    )
