"""The rollout server's Prometheus metrics, served at ``GET /metrics`` (admin token).

Each server owns its own :class:`~prometheus_client.CollectorRegistry`, never the process-wide
one: tests and the one-process stack run several servers in one process. Counters count what
this server's life did (tasks submitted, dispatch attempts, callbacks); the gauges describe state
and are read when the metrics are scraped: sessions by status from the store, nodes and their
pools from their latest heartbeats. The full list, with example queries, is in
docs/observability.md.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.responses import Response

from polar.rollout.nodes import NodeRecord
from polar.schemas.task import SessionStatus
from polar.schemas.token_delivery import LossReason, TokenDelivery

# A node answers a dispatch in milliseconds; seconds mean it is struggling.
DISPATCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Sessions and tasks run from seconds (a scripted agent) to hours (SWE tasks, big groups).
DURATION_BUCKETS = (
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
)

HEALTHY, DRAINING, DRAINED, SILENT, DEAD = "healthy", "draining", "drained", "silent", "dead"
NODE_STATES = (HEALTHY, DRAINING, DRAINED, SILENT, DEAD)


class RolloutMetrics:
    """One rollout server's metrics and the registry they are exposed from."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.tasks_submitted = Counter(
            "polar_rollout_tasks_submitted_total", "Tasks submitted.", registry=r
        )
        self.tasks_completed = Counter(
            "polar_rollout_tasks_completed_total",
            "Tasks whose every session finished.",
            registry=r,
        )
        self.task_seconds = Histogram(
            "polar_rollout_task_duration_seconds",
            "Seconds from a task's submission until its last session finished.",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.sessions_finished = Counter(
            "polar_rollout_sessions_finished_total",
            "Sessions finished, by final status (COMPLETED, ERROR, TIMEOUT).",
            ["status"],
            registry=r,
        )
        self.session_seconds = Histogram(
            "polar_rollout_session_duration_seconds",
            "Seconds a finished session spent on its node (queued to result), by final status.",
            ["status"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.sessions = Gauge(
            "polar_rollout_sessions",
            "Sessions of every task the server keeps, by status.",
            ["status"],
            registry=r,
        )
        self.dispatch_seconds = Histogram(
            "polar_rollout_dispatch_duration_seconds",
            "Seconds one dispatch attempt took, from sending a session to its node's answer.",
            buckets=DISPATCH_BUCKETS,
            registry=r,
        )
        self.dispatch_attempts = Counter(
            "polar_rollout_dispatch_attempts_total",
            "Dispatch attempts by outcome: delivered; refused (node full or draining: the session"
            " goes back to the queue); retry (5xx or no answer); rejected (4xx: the session"
            " fails); error (a broken answer: the session fails).",
            ["outcome"],
            registry=r,
        )
        self.callbacks = Counter(
            "polar_rollout_callbacks_total",
            "Results handed to a task's callback_url, by final state (delivered, failed).",
            ["state"],
            registry=r,
        )
        self.callback_retries = Counter(
            "polar_rollout_callback_retries_total",
            "Callback attempts after the first of their session (the receiver was down or"
            " answered 5xx).",
            registry=r,
        )
        self.sampled_tokens = Counter(
            "polar_rollout_sampled_tokens_total",
            "Tokens the engine sampled in finished sessions (counted by their builders).",
            registry=r,
        )
        self.delivered_tokens = Counter(
            "polar_rollout_delivered_tokens_total",
            "Sampled tokens that reached a trainable trace of a completed session.",
            registry=r,
        )
        self.lost_tokens = Counter(
            "polar_rollout_lost_tokens_total",
            "Sampled tokens that did not reach a trainable trace, by reason (stale, "
            "retry_abandoned, multiple_policy_versions, aborted, drift_break, side_call, "
            "timeout, evaluator_failure, agent_error, infra_error).",
            ["reason"],
            registry=r,
        )
        for reason in LossReason:
            self.lost_tokens.labels(reason.value)
        self.delivery = TokenDelivery()
        """Every finished session's delivery since the server started (the dashboard's)."""
        self.nodes = Gauge(
            "polar_rollout_nodes",
            "Known nodes by state: healthy, draining, drained (and stopped), silent (missed "
            "heartbeats), dead.",
            ["state"],
            registry=r,
        )
        self.node_sessions = Gauge(
            "polar_rollout_node_sessions",
            "Each node's unfinished sessions by lifecycle stage, from its latest heartbeat.",
            ["node_id", "stage"],
            registry=r,
        )
        self.node_workers = Gauge(
            "polar_rollout_node_workers",
            "Each node's workers per pool (init, run, postrun), from its latest heartbeat.",
            ["node_id", "pool"],
            registry=r,
        )
        self.node_capacity = Gauge(
            "polar_rollout_node_capacity",
            "Sessions each node said it can take more of, in its latest heartbeat.",
            ["node_id"],
            registry=r,
        )

    def callback_done(self, delivered: bool) -> None:
        self.callbacks.labels("delivered" if delivered else "failed").inc()

    def session_finished(self, status: SessionStatus, timing: dict[str, float]) -> None:
        self.sessions_finished.labels(status.value).inc()
        total = timing.get("total")
        if total is not None:
            self.session_seconds.labels(status.value).observe(total)

    def tokens_delivered(self, delivery: TokenDelivery) -> None:
        """Count a finished session's sampled tokens: delivered, or lost by reason."""
        self.delivery = self.delivery.plus(delivery)
        self.sampled_tokens.inc(delivery.sampled_tokens)
        self.delivered_tokens.inc(delivery.delivered_tokens)
        for reason, tokens in delivery.lost.by_reason():
            self.lost_tokens.labels(reason.value).inc(tokens)

    def response(self, counts: dict[str, int], nodes: list[tuple[NodeRecord, str]]) -> Response:
        """The scrape's answer, with the state gauges set from ``counts`` (sessions per
        status) and ``nodes`` (each node with its state, one of NODE_STATES)."""
        for session_status in SessionStatus:
            name = session_status.value
            self.sessions.labels(name).set(counts.get(name, 0))
        states = dict.fromkeys(NODE_STATES, 0)
        self.node_sessions.clear()
        self.node_workers.clear()
        self.node_capacity.clear()
        for record, state in nodes:
            states[state] += 1
            status = record.status
            if status is None or state == DEAD:
                continue
            for stage, count in status.stages.model_dump().items():
                self.node_sessions.labels(record.node_id, stage).set(count)
            for pool in ("init", "run", "postrun"):
                self.node_workers.labels(record.node_id, pool).set(getattr(status.workers, pool))
            self.node_capacity.labels(record.node_id).set(status.capacity)
        for state, count in states.items():
            self.nodes.labels(state).set(count)
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
