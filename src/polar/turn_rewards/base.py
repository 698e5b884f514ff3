"""The interface every turn-reward hook implements: score one call from what followed it.

A hook runs after the session, over the gateway's capture records: for each agent call it sees
the call (prompt messages, the reply) and what followed (the next call of the same agent, whose
request carries the tool results the reply caused). It returns a score, or ``None`` to leave the
turn unscored. Scores land in the trace as :class:`~polar.schemas.trajectory.TurnReward` spans
over the call's sampled tokens, so trainers and exports see them aligned with the tokens.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel

from polar import config_loader
from polar.capture.records import CaptureRecord
from polar.engines.base import Engine
from polar.schemas.task import TurnRewardSpec
from polar.trajectory.lineage import Relation, SessionTree, learn_eot, session_tree

ConfigT = TypeVar("ConfigT", bound=BaseModel)


@dataclass(frozen=True)
class Turn:
    """One agent call and what followed it."""

    call: CaptureRecord
    following: CaptureRecord | None
    """The next call continuing this one (None: the session's last word on this branch)."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The prompt the call answered (normalized chat messages)."""
        return list(self.call.upstream_request.get("messages") or [])

    @property
    def reply(self) -> dict[str, Any]:
        return self.call.response

    @property
    def results(self) -> list[dict[str, Any]]:
        """Messages the harness added after the reply (tool results, user turns)."""
        if self.following is None:
            return []
        later = list(self.following.upstream_request.get("messages") or [])
        return later[len(self.messages) + 1 :]


@dataclass(frozen=True)
class TurnScore:
    reward: float
    details: dict[str, Any] = field(default_factory=dict)


class TurnRewardHook(ABC):
    """Built from a :class:`TurnRewardSpec`; ``engine`` is the gateway's, for judges."""

    name: ClassVar[str]

    def __init__(self, spec: TurnRewardSpec, engine: Engine | None = None) -> None:
        self.spec = spec
        self.engine = engine

    @abstractmethod
    async def score(self, turn: Turn) -> TurnScore | None: ...

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most hold nothing
        """Release what the hook holds (HTTP clients)."""


def parse_config(model: type[ConfigT], spec: TurnRewardSpec) -> ConfigT:
    """``spec.config`` validated against ``model``, or a ConfigError naming the bad keys."""
    return config_loader.parse_config(
        model, spec.config, what=f"config of turn reward {spec.strategy!r}"
    )


# The next call of the same agent: it extends the call's prompt, or rewrites its history (a
# template that drops past reasoning, a compaction's summary request without the tools) and
# still carries the tool results.
_SAME_AGENT = (Relation.CONTINUES, Relation.REWRITES, Relation.SUMMARY)


def session_turns(records: Sequence[CaptureRecord], tree: SessionTree | None = None) -> list[Turn]:
    """Every call (time order) with the first later call of the same agent that follows it."""
    calls = sorted(records, key=lambda r: (r.seq, r.started_at))
    if tree is None:
        tree = session_tree(calls, learn_eot(calls))
    following: dict[str, CaptureRecord] = {}
    for call in calls:
        link = tree.links.get(call.completion_id)
        if link is not None and link.parent is not None and link.relation in _SAME_AGENT:
            following.setdefault(link.parent, call)
    return [Turn(call, following.get(call.completion_id)) for call in calls]
