"""The delivered fraction: how many sampled tokens reach a trainable trace, and where the rest
went, by reason (what NeMo Gym calls a rollout's "delivered fraction").

Two steps, each a pure function of typed facts. The builder counts, per session, every sampled
token of every captured call: delivered (loss mask 1 in a trace the trainer can score) or lost
to a builder reason (masked stale, abandoned retry, several policy versions, aborted, a side call
left out, a trace with no prompt to condition on). It writes that count into the trajectory's
``delivery`` (read as ``Trajectory.stats.delivery``). Then the session's outcome settles it:
the tokens of a session that timed out, whose evaluator failed, or that errored reach no update
whatever their mask (:func:`settle`, read as ``SessionResult.delivery``). Counts add up, so a
task's or a run's delivery is the sum of its sessions' (:meth:`TokenDelivery.total`).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator


class LossReason(StrEnum):
    """Why sampled tokens did not reach a trainable trace of a usable session."""

    STALE = "stale"
    """Masked: sampled at a policy version older than the builder's ``max_staleness`` allows."""
    RETRY_ABANDONED = "retry_abandoned"
    """Masked: an attempt the harness retried and abandoned."""
    MULTIPLE_POLICY_VERSIONS = "multiple_policy_versions"
    """Masked: a trace spanning several policy versions (``multi_version_trainable: false``)."""
    ABORTED = "aborted"
    """Masked: a trace holding a generation the engine cut short (a weight update)."""
    DRIFT_BREAK = "drift_break"
    """A call the builder could not merge into any context: its trace has no prompt ids, so
    nothing predicts its first token. Other breaks cost no tokens (the call opens a segment of
    its own and stays trainable); they cost a re-prefill, counted in ``breaks``."""
    SIDE_CALL = "side_call"
    """A side call (title, memory, routing) left out by ``side_calls: exclude``."""
    TIMEOUT = "timeout"
    """The session ran out of time (a partial trajectory; GRPO does not score it as done)."""
    EVALUATOR_FAILURE = "evaluator_failure"
    """The evaluator raised: the session has no reward to learn from."""
    AGENT_ERROR = "agent_error"
    """The harness failed (or the session errored for a cause it did not name)."""
    INFRA_ERROR = "infra_error"
    """The node, runtime or server failed: says nothing about the policy."""


# The builder's reasons a trace's mask span can carry (MaskReason values), in the order a call
# masked for several is counted under.
MASK_REASONS = (
    LossReason.ABORTED,
    LossReason.MULTIPLE_POLICY_VERSIONS,
    LossReason.RETRY_ABANDONED,
    LossReason.STALE,
)
_OUTCOME_REASONS = {
    "timeout": LossReason.TIMEOUT,
    "evaluator": LossReason.EVALUATOR_FAILURE,
    "agent": LossReason.AGENT_ERROR,
    "infra": LossReason.INFRA_ERROR,
}


class LostTokens(BaseModel):
    """Sampled tokens that reached no trainable trace of a usable session, one field a reason."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stale: int = Field(0, ge=0)
    retry_abandoned: int = Field(0, ge=0)
    multiple_policy_versions: int = Field(0, ge=0)
    aborted: int = Field(0, ge=0)
    drift_break: int = Field(0, ge=0)
    side_call: int = Field(0, ge=0)
    timeout: int = Field(0, ge=0)
    evaluator_failure: int = Field(0, ge=0)
    agent_error: int = Field(0, ge=0)
    infra_error: int = Field(0, ge=0)

    def of(self, reason: LossReason) -> int:
        value: int = getattr(self, reason.value)
        return value

    def by_reason(self) -> list[tuple[LossReason, int]]:
        """Every reason that lost tokens, most first."""
        counts = [(r, self.of(r)) for r in LossReason if self.of(r)]
        return sorted(counts, key=lambda item: -item[1])

    @property
    def total(self) -> int:
        return sum(self.of(r) for r in LossReason)

    def plus(self, other: LostTokens) -> LostTokens:
        return LostTokens(**{r.value: self.of(r) + other.of(r) for r in LossReason})

    def adding(self, reason: LossReason, tokens: int) -> LostTokens:
        return self.model_copy(update={reason.value: self.of(reason) + tokens})


class TokenDelivery(BaseModel):
    """One session's (or a task's, or a run's) sampled tokens: delivered, and lost by reason.

    ``unknown_sessions`` counts sessions whose tokens could not be counted (no trajectory, or
    one built before the builder counted them); their tokens are in neither figure.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    sampled_tokens: int = Field(0, ge=0)
    delivered_tokens: int = Field(0, ge=0)
    lost: LostTokens = Field(default_factory=LostTokens)
    sessions: int = Field(0, ge=0)
    unknown_sessions: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _accounted(self) -> TokenDelivery:
        if self.delivered_tokens + self.lost.total != self.sampled_tokens:
            raise ValueError(
                f"{self.delivered_tokens} delivered + {self.lost.total} lost tokens are not the "
                f"{self.sampled_tokens} sampled"
            )
        return self

    @property
    def fraction(self) -> float | None:
        """Delivered over sampled; None when nothing was sampled."""
        return self.delivered_tokens / self.sampled_tokens if self.sampled_tokens else None

    @classmethod
    def unknown(cls) -> TokenDelivery:
        """A session whose tokens are not known."""
        return cls(sessions=1, unknown_sessions=1)

    @classmethod
    def total(cls, items: Iterable[TokenDelivery]) -> TokenDelivery:
        out = cls()
        for item in items:
            out = out.plus(item)
        return out

    def plus(self, other: TokenDelivery) -> TokenDelivery:
        return TokenDelivery(
            sampled_tokens=self.sampled_tokens + other.sampled_tokens,
            delivered_tokens=self.delivered_tokens + other.delivered_tokens,
            lost=self.lost.plus(other.lost),
            sessions=self.sessions + other.sessions,
            unknown_sessions=self.unknown_sessions + other.unknown_sessions,
        )

    def losing(self, reason: LossReason) -> TokenDelivery:
        """The same tokens, the delivered ones now lost to ``reason``."""
        return self.model_copy(
            update={
                "delivered_tokens": 0,
                "lost": self.lost.adding(reason, self.delivered_tokens),
            }
        )

    def metrics(self) -> dict[str, float | int | dict[str, int]]:
        """Flat numbers for a step's metrics line (the fraction 0 when nothing was sampled)."""
        return {
            "fraction": self.fraction if self.fraction is not None else 0.0,
            "sampled_tokens": self.sampled_tokens,
            "delivered_tokens": self.delivered_tokens,
            "lost": {r.value: n for r, n in self.lost.by_reason()},
            "unknown_sessions": self.unknown_sessions,
        }

    def describe(self) -> str:
        """``delivered 81.3% of 1,204 sampled tokens (lost: timeout 180, side call 45)``."""
        if self.fraction is None:
            text = "no sampled tokens counted"
        else:
            text = f"delivered {self.fraction:.1%} of {self.sampled_tokens:,} sampled tokens"
            lost = ", ".join(f"{r.value.replace('_', ' ')} {n:,}" for r, n in self.lost.by_reason())
            if lost:
                text += f" (lost: {lost})"
        if self.unknown_sessions:
            text += f"; {self.unknown_sessions} session(s) not counted"
        return text


def settle(built: TokenDelivery | None, status: str, failure_kind: str | None) -> TokenDelivery:
    """A session's delivery once its outcome is known: the builder's count, with the tokens it
    delivered lost to the session's failure when it did not complete (``status`` is the
    SessionStatus value, ``failure_kind`` its SessionFailure kind)."""
    if built is None:
        return TokenDelivery.unknown()
    built = built.model_copy(update={"sessions": 1, "unknown_sessions": 0})
    if status == "COMPLETED":
        return built
    if status == "TIMEOUT":
        return built.losing(LossReason.TIMEOUT)
    return built.losing(_OUTCOME_REASONS.get(failure_kind or "", LossReason.AGENT_ERROR))
