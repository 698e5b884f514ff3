"""The dashboard's view data: the server's nodes, tasks and throughput as plain values the
templates draw. Pure functions of what the service and its store answer."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from polar.rollout.activity import Activity, NodeActivity, Rates
from polar.rollout.dashboard.outcomes import SessionOutcome
from polar.rollout.store import TaskRow
from polar.schemas.rollout import NodeView
from polar.schemas.task import SessionStatus
from polar.schemas.token_delivery import TokenDelivery

# Sessions of a task by where they are: finished well or badly, on a node, or waiting for one.
_ACTIVE = frozenset(
    {
        SessionStatus.INITIALIZING,
        SessionStatus.READY,
        SessionStatus.RUNNING,
        SessionStatus.POST_RUN,
        SessionStatus.BUILDING,
        SessionStatus.EVALUATING,
    }
)
REASON_CHARS = 160
# Rewards with at most this many distinct values get a bar each; more are binned.
DISTINCT_REWARDS = 6
REWARD_BINS = 8


@dataclass(frozen=True)
class Pool:
    """One of a node's stages: sessions in it, its worker count, and those queued for it."""

    name: str
    busy: int
    size: int
    waiting: int

    @property
    def share(self) -> float:
        return 100.0 * min(self.busy, self.size) / self.size if self.size else 0.0


@dataclass(frozen=True)
class NodeCard:
    node_id: str
    url: str | None
    state: str  # healthy, draining, silent (missed heartbeats), dead
    seen_s_ago: float
    capacity: int
    paused: bool
    policy_version: int
    pools: list[Pool]
    finished: int
    mean_seconds: float | None


@dataclass(frozen=True)
class Segment:
    kind: str  # ok, error, timeout, active, queued
    count: int
    share: float


@dataclass(frozen=True)
class Bin:
    label: str
    count: int
    height: float  # percent of the tallest bin


@dataclass(frozen=True)
class TaskCard:
    task_id: str
    status: str
    num_samples: int
    finished: int
    progress: list[Segment]
    rewarded: int
    passed: int
    mean_reward: float | None
    histogram: list[Bin]
    errors: int
    timeouts: int
    reasons: list[tuple[str, int]]
    seconds: float | None  # wall time so far, or until it completed
    delivery: TokenDelivery  # its finished sessions' sampled tokens, delivered or lost

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.rewarded if self.rewarded else None


@dataclass(frozen=True)
class Throughput:
    last_minute: Rates
    last_five: Rates
    finished_total: int
    spark: str  # SVG polyline points: sessions finished per bucket over the window
    spark_peak: int
    window_min: float


def node_card(view: NodeView, activity: NodeActivity | None) -> NodeCard:
    stages, workers = view.stages, view.workers
    if view.drained:
        state = "drained"
    elif view.dead:
        state = "dead"
    elif view.draining:
        state = "draining"
    elif not view.healthy:
        state = "silent"
    else:
        state = "healthy"
    return NodeCard(
        node_id=view.node_id,
        url=view.url,
        state=state,
        seen_s_ago=view.seen_s_ago,
        capacity=view.capacity,
        paused=view.paused,
        policy_version=view.policy_version,
        pools=[
            Pool(
                "INIT",
                stages.get("initializing", 0),
                workers.get("init", 0),
                stages.get("queued", 0),
            ),
            Pool("READY", stages.get("ready", 0), workers.get("ready_buffer", 0), 0),
            Pool("RUN", stages.get("running", 0), workers.get("run", 0), 0),
            Pool(
                "POSTRUN",
                stages.get("postrun", 0),
                workers.get("postrun", 0),
                stages.get("postrun_queued", 0),
            ),
        ],
        finished=activity.finished if activity else 0,
        mean_seconds=activity.mean_seconds if activity else None,
    )


def task_card(task: TaskRow, outcomes: list[SessionOutcome], now: float) -> TaskCard:
    statuses = Counter(o.status for o in outcomes)
    total = max(task.request.num_samples, 1)
    progress = [
        Segment(kind, count, 100.0 * count / total)
        for kind, count in (
            ("ok", statuses[SessionStatus.COMPLETED]),
            ("error", statuses[SessionStatus.ERROR]),
            ("timeout", statuses[SessionStatus.TIMEOUT]),
            ("active", sum(statuses[s] for s in _ACTIVE)),
            ("queued", statuses[SessionStatus.REGISTERED]),
        )
        if count
    ]
    rewards = [o.reward for o in outcomes if o.reward is not None]
    failed = [o for o in outcomes if o.status in (SessionStatus.ERROR, SessionStatus.TIMEOUT)]
    end = task.finished_at if task.finished_at is not None else now
    return TaskCard(
        task_id=task.task_id,
        status=task.status.value,
        num_samples=task.request.num_samples,
        finished=sum(n for s, n in statuses.items() if s.finished),
        progress=progress,
        rewarded=len(rewards),
        passed=sum(1 for r in rewards if r > 0),
        mean_reward=sum(rewards) / len(rewards) if rewards else None,
        histogram=reward_histogram(rewards),
        errors=statuses[SessionStatus.ERROR],
        timeouts=statuses[SessionStatus.TIMEOUT],
        reasons=Counter(_reason(o) for o in failed).most_common(3),
        seconds=max(0.0, end - task.created_at),
        delivery=TokenDelivery.total(
            o.delivery or TokenDelivery.unknown() for o in outcomes if o.status.finished
        ),
    )


def reward_histogram(rewards: list[float]) -> list[Bin]:
    """A bar per distinct reward when there are few (0 and 1, say), else equal-width bins."""
    if not rewards:
        return []
    distinct = sorted(set(rewards))
    if len(distinct) <= DISTINCT_REWARDS:
        counts = Counter(rewards)
        return _bins([(f"{value:g}", counts[value]) for value in distinct])
    low, high = distinct[0], distinct[-1]
    width = (high - low) / REWARD_BINS
    bins = [0] * REWARD_BINS
    for r in rewards:
        bins[min(int((r - low) / width), REWARD_BINS - 1)] += 1
    return _bins([(f"{low + i * width:.2g}", n) for i, n in enumerate(bins)])


def throughput(activity: Activity) -> Throughput:
    counts = activity.histogram()
    peak = max(counts, default=0)
    step = 240 / max(len(counts) - 1, 1)
    points = " ".join(
        f"{i * step:.1f},{38 - (34 * n / peak if peak else 0):.1f}" for i, n in enumerate(counts)
    )
    return Throughput(
        last_minute=activity.rates(60.0),
        last_five=activity.rates(300.0),
        finished_total=activity.total,
        spark=points,
        spark_peak=peak,
        window_min=activity.window_s / 60,
    )


def _bins(pairs: Iterable[tuple[str, int]]) -> list[Bin]:
    pairs = list(pairs)
    tallest = max((n for _, n in pairs), default=0) or 1
    return [Bin(label, n, 100.0 * n / tallest) for label, n in pairs]


def _reason(outcome: SessionOutcome) -> str:
    """An error's first line, cut short: sessions that failed alike are counted together."""
    if not outcome.error:
        return "timed out" if outcome.status == SessionStatus.TIMEOUT else "no reason given"
    line = outcome.error.strip().splitlines()[0] if outcome.error.strip() else outcome.error
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 1] + "…"
