"""Which threads a node's blocking work runs on: POST-RUN's apart from everything else.

``asyncio.to_thread`` always submits to the loop's default executor, so a custom evaluator that
blocks in a thread (a read that never returns) used to hold one of the few threads every other
``to_thread`` on the node needs: a handful of wedged evaluators stopped calls and every stage.
:func:`route_default_executor` makes the loop's default executor a :class:`RoutingExecutor`,
which sends a submission made under :func:`on_evaluator_threads` to that bounded pool instead.
The lifecycle runs each POST-RUN under its node's pool (``node.evaluator_threads``), so a wedge
costs only evaluator capacity: later evaluations wait for a thread and end at their bound.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

# The node's evaluator pool, set for a POST-RUN by the lifecycle; and the pool submissions go
# to, set only while an evaluator evaluates (building a trajectory keeps the loop's threads).
_NODE_POOL: contextvars.ContextVar[Executor | None] = contextvars.ContextVar(
    "polar_node_evaluator_pool", default=None
)
_ROUTE_TO: contextvars.ContextVar[Executor | None] = contextvars.ContextVar(
    "polar_route_to", default=None
)


class RoutingExecutor(ThreadPoolExecutor):
    """The loop's default executor: its own threads, unless the submitting context is an
    evaluator's (a copied context carries that into every task the evaluator starts)."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        pool = _ROUTE_TO.get()
        if pool is not None:
            return pool.submit(fn, *args, **kwargs)
        return super().submit(fn, *args, **kwargs)


def route_default_executor() -> None:
    """Install a :class:`RoutingExecutor` as the running loop's default executor (once)."""
    loop = asyncio.get_running_loop()
    if not getattr(loop, "_polar_routed", False):
        loop.set_default_executor(RoutingExecutor(thread_name_prefix="asyncio"))
        setattr(loop, "_polar_routed", True)  # noqa: B010 (asyncio has no public getter)


@contextmanager
def node_evaluator_pool(pool: Executor) -> Iterator[None]:
    """Within this context (a node's POST-RUN), :func:`evaluator_threads` means ``pool``."""
    token = _NODE_POOL.set(pool)
    try:
        yield
    finally:
        _NODE_POOL.reset(token)


@contextmanager
def evaluator_threads() -> Iterator[None]:
    """``asyncio.to_thread`` in this context, and in tasks started from it, runs on the node's
    evaluator pool (on the loop's own threads outside a node)."""
    token = _ROUTE_TO.set(_NODE_POOL.get())
    try:
        yield
    finally:
        _ROUTE_TO.reset(token)
