"""The gateway's Prometheus metrics, served at ``GET /metrics`` (admin token).

Each app owns its own :class:`~prometheus_client.CollectorRegistry`, never the process-wide
one: a trainer or a test may run several gateways in one process, and each must count only its
own calls. Counters and histograms are updated on the call path (:mod:`polar.gateway.proxy`);
the gauges that describe state (open sessions, the capture writer's queue, a node's pools) are
read when the metrics are scraped. The full list, with example queries, is in
docs/observability.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from typing import TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from starlette.responses import Response

from polar.capture.store import CaptureStore
from polar.engines.types import PrefixCacheCounters
from polar.errors import ClientDisconnected, GatewayError
from polar.gateway.sessions import SessionRegistry
from polar.schemas.node import NodeStatus

T = TypeVar("T")

# A model call takes from a fraction of a second to minutes (long generations, a paused gate).
CALL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# A capture commit is a batched SQLite transaction: milliseconds, unless the disk stalls.
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

OK, ERROR, DISCONNECTED = "ok", "error", "disconnected"


class GatewayMetrics:
    """One gateway's metrics and the registry they are exposed from."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.calls = Counter(
            "polar_gateway_calls_total",
            "Generation calls answered, by provider API, stream mode and outcome"
            " (ok, error, disconnected).",
            ["provider", "stream", "outcome"],
            registry=r,
        )
        self.call_seconds = Histogram(
            "polar_gateway_call_duration_seconds",
            "Seconds from a generation call's arrival until its reply (or error) was ready.",
            ["provider", "stream"],
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self.engine_seconds = Histogram(
            "polar_gateway_engine_duration_seconds",
            "Seconds one engine call took (the gateway's wait on a paused gate excluded).",
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "polar_gateway_capture_commit_duration_seconds",
            "Seconds from handing a record to the capture writer until it was durable.",
            buckets=COMMIT_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            "polar_gateway_errors_total",
            "Errors the model API answered (plain HTTP or in-stream), by provider and kind.",
            ["provider", "kind"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "polar_gateway_prompt_tokens_total",
            "Prompt tokens of the calls captured, by provider API.",
            ["provider"],
            registry=r,
        )
        self.sampled_tokens = Counter(
            "polar_gateway_sampled_tokens_total",
            "Tokens the engine sampled for the calls captured, by provider API.",
            ["provider"],
            registry=r,
        )
        self.prefix_cache_ratio = Gauge(
            "polar_gateway_engine_prefix_cache_hit_ratio",
            "Share of prompt tokens the engine found in its prefix cache since it started, per "
            'replica and over all (replica="all"), from the engine\'s own counters.',
            ["replica"],
            registry=r,
        )
        self.prefix_cache_queries = Gauge(
            "polar_gateway_engine_prefix_cache_queries",
            "The engine's own prefix-cache query counter (prompt tokens), per replica.",
            ["replica"],
            registry=r,
        )
        self.prefix_cache_hits = Gauge(
            "polar_gateway_engine_prefix_cache_hits",
            "The engine's own prefix-cache hit counter (prompt tokens), per replica.",
            ["replica"],
            registry=r,
        )
        self.capture_queue = Gauge(
            "polar_gateway_capture_queue_depth",
            "Operations waiting for the capture store's writer thread.",
            registry=r,
        )
        self.capture_fault = Gauge(
            "polar_gateway_capture_fault",
            "1 while the capture store refuses writes (disk full, write lock held), else 0.",
            registry=r,
        )
        self.sessions_open = Gauge(
            "polar_gateway_sessions_open",
            "Sessions whose key the gateway answers now.",
            registry=r,
        )
        self.node_sessions = Gauge(
            "polar_gateway_node_sessions",
            "A rollout node's unfinished sessions by lifecycle stage.",
            ["node_id", "stage"],
            registry=r,
        )
        self.node_workers = Gauge(
            "polar_gateway_node_workers",
            "A rollout node's configured workers per pool (init, run, postrun).",
            ["node_id", "pool"],
            registry=r,
        )
        self.node_draining = Gauge(
            "polar_gateway_node_draining",
            "1 while the node accepts no new sessions.",
            ["node_id"],
            registry=r,
        )
        self.node_finished = _NodeFinished()
        r.register(self.node_finished)

    # -- the call path -------------------------------------------------------------------

    def call(self, provider: str, stream: bool) -> CallTimer:
        """Start timing one generation call."""
        return CallTimer(self, provider, stream)

    def error(self, provider: str, err: GatewayError) -> None:
        """Count an error the caller was answered with."""
        self.errors.labels(provider, err.kind).inc()

    async def engine_call(self, call: Awaitable[T]) -> T:
        """``call``'s result; its duration is observed whether it answered or failed, not
        when it was cancelled (the caller left: the engine's time says nothing then)."""
        started = time.perf_counter()
        try:
            result = await call
        except Exception:
            self.engine_seconds.observe(time.perf_counter() - started)
            raise
        self.engine_seconds.observe(time.perf_counter() - started)
        return result

    async def capture_commit(self, commit: Awaitable[T]) -> T:
        """``commit``'s result; the duration of commits that succeeded is observed."""
        started = time.perf_counter()
        result = await commit
        self.commit_seconds.observe(time.perf_counter() - started)
        return result

    def tokens(self, provider: str, prompt: int, sampled: int) -> None:
        self.prompt_tokens.labels(provider).inc(prompt)
        self.sampled_tokens.labels(provider).inc(sampled)

    # -- scraping ------------------------------------------------------------------------

    def engine_prefix_cache(self, counters: dict[str, PrefixCacheCounters]) -> None:
        """The engines' prefix-cache counters as read for this scrape (replicas that did not
        answer keep their last values)."""
        if not counters:
            return
        total = sum(counters.values(), PrefixCacheCounters(0.0, 0.0))
        for replica, c in [*counters.items(), ("all", total)]:
            self.prefix_cache_queries.labels(replica).set(c.queries)
            self.prefix_cache_hits.labels(replica).set(c.hits)
            if c.hit_ratio is not None:
                self.prefix_cache_ratio.labels(replica).set(c.hit_ratio)

    def response(
        self, store: CaptureStore, sessions: SessionRegistry, node: NodeStatus | None
    ) -> Response:
        """The scrape's answer: the text exposition format, the state gauges read now."""
        return Response(self.render(store, sessions, node), media_type=CONTENT_TYPE_LATEST)

    def render(
        self, store: CaptureStore, sessions: SessionRegistry, node: NodeStatus | None
    ) -> bytes:
        """The exposition text, with the state gauges read now."""
        self.capture_queue.set(store.queue_depth)
        self.capture_fault.set(0 if store.fault is None else 1)
        self.sessions_open.set(len(sessions))
        if node is not None:
            for stage, count in node.stages.model_dump().items():
                self.node_sessions.labels(node.node_id, stage).set(count)
            for pool in ("init", "run", "postrun"):
                self.node_workers.labels(node.node_id, pool).set(getattr(node.workers, pool))
            self.node_draining.labels(node.node_id).set(1 if node.draining else 0)
            self.node_finished.status = node
        return generate_latest(self.registry)


class _NodeFinished(Collector):
    """The node's own count of finished sessions, exposed as the counter it is."""

    def __init__(self) -> None:
        self.status: NodeStatus | None = None

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "polar_gateway_node_sessions_finished",
            "Sessions the node finished since it started.",
            labels=["node_id"],
        )
        if self.status is not None:
            family.add_metric([self.status.node_id], self.status.finished)
        yield family


class CallTimer:
    """One generation call: its outcome counted and its duration observed exactly once."""

    def __init__(self, metrics: GatewayMetrics, provider: str, stream: bool) -> None:
        self.metrics = metrics
        self.provider = provider
        self.stream = "true" if stream else "false"
        self.started = time.perf_counter()
        self._done = False

    def end(self, error: BaseException | None = None) -> None:
        if self._done:
            return
        self._done = True
        m = self.metrics
        m.call_seconds.labels(self.provider, self.stream).observe(
            time.perf_counter() - self.started
        )
        m.calls.labels(self.provider, self.stream, _outcome(error)).inc()

    async def watch(self, completion: Awaitable[T], *, in_stream: bool) -> T:
        """``completion``, with the call ended by its outcome. ``in_stream``: its errors are
        answered in the open stream (counted here), not as a plain HTTP error (counted where
        that is rendered)."""
        try:
            result = await completion
        except BaseException as exc:
            self.end(exc)
            if in_stream:
                self.metrics.error(self.provider, _as_gateway_error(exc))
            raise
        self.end()
        return result


def _outcome(error: BaseException | None) -> str:
    if error is None:
        return OK
    if isinstance(error, ClientDisconnected | asyncio.CancelledError):
        return DISCONNECTED
    return ERROR


def _as_gateway_error(exc: BaseException) -> GatewayError:
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, asyncio.CancelledError):
        return ClientDisconnected("the caller left mid-stream")
    return GatewayError(f"internal gateway error: {exc!r}")
