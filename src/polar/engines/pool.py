"""Several engine replicas behind one :class:`Engine`: session affinity, health, replica loss.

A multi-turn session is fast only while each call lands on the replica whose prefix cache holds
its earlier turns. A new session goes to the least-loaded healthy replica and every later call of
that session to the same one. The assignment survives a gateway restart without a table of its
own: every capture record names the replica that served it (``engine`` is ``vllm@host:port``),
so after a restart the pool asks the store (``recall``) where the session's last call ran.
Rendezvous hashing alone would also survive restarts, but it cannot place new sessions by load
and it reshuffles sessions whenever the healthy set changes; the record is the exact answer.

A replica that stops answering is marked down (a failed call is confirmed by a health probe, so a
busy replica's refusal is not mistaken for death) and the call is retried on another; the moved
session stays there and its calls carry :data:`FLAG_REPLICA_MOVED`. Token prompts are rendered
by the gateway, so the moved call's prompt is the same ids and merged contexts stay exact.
Pause/resume and policy versions live in the gateway in front of the pool, so they hold for every
replica at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from polar.engines.base import Engine
from polar.engines.types import EngineResult, ModelInfo, PrefixCacheCounters, SampledTokens
from polar.errors import EngineUnavailable
from polar.providers.types import NormalizedRequest
from polar.schemas.flags import FLAG_REPLICA_MOVED

log = logging.getLogger(__name__)

T = TypeVar("T")
# The replica (its name) that served a session's latest recorded call, if any.
RecallReplica = Callable[[str], str | None]


@dataclass
class Replica:
    """One engine of the pool, and what the pool knows about it."""

    name: str
    engine: Engine
    healthy: bool = True
    in_flight: int = 0
    sessions: int = 0

    @property
    def label(self) -> str:
        """What a capture record's ``engine`` says: the engine kind and the replica."""
        return f"{self.engine.name}@{self.name}"


def replica_of(engine_label: str | None) -> str | None:
    """The replica name inside a record's ``engine`` label (None for a single engine)."""
    if not engine_label or "@" not in engine_label:
        return None
    return engine_label.split("@", 1)[1]


class EnginePool(Engine):
    """Routes each call to its session's replica; the gateway sees one engine."""

    name: ClassVar[str] = "pool"

    def __init__(
        self,
        replicas: list[Replica],
        *,
        recall: RecallReplica | None = None,
        health_interval_s: float = 5.0,
        health_timeout_s: float = 5.0,
    ) -> None:
        if not replicas:
            raise ValueError("an engine pool needs at least one replica")
        names = [r.name for r in replicas]
        if len(set(names)) != len(names):
            raise ValueError(f"engine replica names repeat: {names}")
        self.replicas = replicas
        self.recall = recall
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self._by_name = {r.name: r for r in replicas}
        self._assigned: dict[str, Replica] = {}
        self._monitor: asyncio.Task[None] | None = None
        # The pool takes token prompts and constraints exactly as its replicas do.
        self.regex_constraint = replicas[0].engine.regex_constraint  # type: ignore[misc]

    def replica_for(self, session_id: str) -> Replica | None:
        """The replica a session is assigned to now (None before its first call)."""
        return self._assigned.get(session_id)

    async def complete(self, request: NormalizedRequest) -> EngineResult:
        result, replica, moved = await self._routed(
            request.session_id, lambda engine: engine.complete(request)
        )
        result.engine = replica.label
        if moved:
            result.tokens.flags.append(FLAG_REPLICA_MOVED)
        return result

    async def complete_tokens(
        self, prompt_ids: list[int], request: NormalizedRequest
    ) -> SampledTokens:
        tokens, replica, moved = await self._routed(
            request.session_id, lambda engine: engine.complete_tokens(prompt_ids, request)
        )
        tokens.engine = replica.label
        if moved:
            tokens.flags.append(FLAG_REPLICA_MOVED)
        return tokens

    async def count_tokens(self, request: NormalizedRequest) -> int:
        count, _, _ = await self._routed(request.session_id, lambda e: e.count_tokens(request))
        return count

    async def model_info(self) -> ModelInfo | None:
        info, _, _ = await self._routed(None, lambda engine: engine.model_info())
        return info

    async def prefix_cache_counters(self) -> dict[str, PrefixCacheCounters]:
        """Each healthy replica's counters, under its name (a replica that fails to answer is
        left out of this scrape)."""
        healthy = [r for r in self.replicas if r.healthy]
        answers = await asyncio.gather(
            *(r.engine.prefix_cache_counters() for r in healthy), return_exceptions=True
        )
        out: dict[str, PrefixCacheCounters] = {}
        for replica, answer in zip(healthy, answers, strict=True):
            if isinstance(answer, dict) and answer:
                out[replica.name] = sum(answer.values(), PrefixCacheCounters(0.0, 0.0))
        return out

    def local_tokenizer(self) -> object | None:
        return self.replicas[0].engine.local_tokenizer()

    async def aclose(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        for replica in self.replicas:
            await replica.engine.aclose()

    async def check_health(self) -> None:
        """Probe every replica once; a replica that answers again takes new sessions."""
        answers = await asyncio.gather(*(self._alive(r) for r in self.replicas))
        for replica, alive in zip(self.replicas, answers, strict=True):
            if alive != replica.healthy:
                log.warning("engine replica %s is %s", replica.name, "up" if alive else "down")
            replica.healthy = alive

    async def _routed(
        self, session_id: str | None, call: Callable[[Engine], Awaitable[T]]
    ) -> tuple[T, Replica, bool]:
        """``call`` on the session's replica; on a dead replica, on the next one chosen."""
        self._ensure_monitor()
        replica, moved = self._choose(session_id)
        while True:
            current = replica
            current.in_flight += 1
            try:
                return await call(current.engine), current, moved
            except EngineUnavailable:
                if await self._alive(current):
                    raise  # alive but refusing (overloaded): its own answer stands
                log.warning("engine replica %s died; moving its sessions", current.name)
                current.healthy = False
                replica, moved = self._choose(session_id)  # moved: the session had a replica
            finally:
                current.in_flight -= 1

    def _choose(self, session_id: str | None) -> tuple[Replica, bool]:
        """The session's replica if it is healthy, else the least-loaded healthy one (and
        whether that moved the session)."""
        previous = self._previous(session_id) if session_id is not None else None
        if previous is not None and previous.healthy:
            return previous, False
        healthy = [r for r in self.replicas if r.healthy]
        if not healthy:
            down = ", ".join(r.name for r in self.replicas)
            raise EngineUnavailable(f"no engine replica is healthy (down: {down})", retry_after=5)
        chosen = min(healthy, key=lambda r: (r.in_flight, r.sessions, _rendezvous(session_id, r)))
        if session_id is not None:
            if previous is not None:
                previous.sessions -= 1
            chosen.sessions += 1
            self._assigned[session_id] = chosen
        return chosen, previous is not None

    def _previous(self, session_id: str) -> Replica | None:
        """Where the session ran before: this process's table, else the store's last record."""
        replica = self._assigned.get(session_id)
        if replica is None and self.recall is not None:
            replica = self._by_name.get(self.recall(session_id) or "")
            if replica is not None:
                replica.sessions += 1
                self._assigned[session_id] = replica
        return replica

    def end_session(self, session_id: str) -> None:
        """A closed session no longer counts on its replica (``sessions`` is the load of open
        sessions) and its assignment is dropped, so a node's table does not grow without end."""
        replica = self._assigned.pop(session_id, None)
        if replica is not None:
            replica.sessions -= 1

    async def _alive(self, replica: Replica) -> bool:
        try:
            await asyncio.wait_for(replica.engine.model_info(), self.health_timeout_s)
        except Exception:  # any failure to answer means "not healthy"
            return False
        return True

    def _ensure_monitor(self) -> None:
        if self._monitor is None or self._monitor.done():
            self._monitor = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.check_health()


def _rendezvous(session_id: str | None, replica: Replica) -> bytes:
    """A stable tie-break: equal loads spread sessions over replicas by hash, not by order."""
    seed = f"{session_id or ''}\0{replica.name}".encode()
    return hashlib.blake2b(seed, digest_size=8).digest()


def routing_key(session_id: str) -> str:
    """The session's key for an external router: a hash, since the session id is also the
    harness's API key and must not leave the gateway."""
    return hashlib.sha256(session_id.encode()).hexdigest()[:32]
