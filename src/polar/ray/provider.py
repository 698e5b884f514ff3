"""The ``ray`` node provider: one gateway actor on every alive Ray node carrying the gateway
resources, and a Ray-observed node death reported as a lost node at once.

It runs inside the rollout server's process (the rollout actor) and reconciles every
``reconcile_s``: what Ray says is alive against the gateways it placed. Gateways are detached
named actors (``polar-gw-<ray node id[:12]>`` in Polar's namespace), so a restarted rollout
server finds them again instead of killing them with itself. A drained node is remembered (in
the server's data dir) and gets no new gateway.

A gateway that crashes is restarted by Ray on its node ``gateways.max_restarts`` times; past
that budget Ray lets it die and frees its name while the node lives on. The provider sees the
name gone, reports the node lost at once (its sessions fail now, not after ``node_grace_s``)
and places a fresh gateway there: at once the first time, then after a doubling backoff, so a
gateway that cannot start does not spin. The fresh gateway has its predecessor's node id and
work dir, so it normally finds the node credential kept there; the provider revokes that
credential first all the same (the rollout server holds the admin token), so a replacement that
lands without the file enrols anew with the enrolment secret instead of being refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from polar.logs import log_event
from polar.ray.actors import GatewayActor, GatewaySpec, gateway_node_id
from polar.ray.config import GATEWAY_ACTOR_PREFIX, RaySection, refusal
from polar.runtimes.registry import unsandboxed_runtimes
from polar.schemas.task import TaskRequest
from polar.stack.servers import NodeHost, node_providers

log = logging.getLogger("polar.ray")

# Past a drain deadline the server has failed what was left; the gateway goes soon after.
_DRAIN_MARGIN_S = 1.0
# A placed gateway's name missing this many rounds running is a gateway gone for good (one
# round could race a listing with the placement).
_MISSING_ROUNDS = 2
# Replacing a gateway gone for good: the 2nd time after this, doubling up to the cap; a
# gateway that lived _REPLACE_RESET_S counts from 1 again.
_REPLACE_BACKOFF_S = 5.0
_REPLACE_MAX_S = 300.0
_REPLACE_RESET_S = 600.0
NodeList = Callable[[], list[dict[str, Any]]]


class RayNodeProvider:
    """Keeps one gateway per eligible node; ``nodes`` and ``cluster`` are Ray's unless a test
    passes fakes (``nodes``: ``ray.nodes()``-shaped dicts)."""

    def __init__(
        self,
        section: RaySection,
        spec: GatewaySpec,
        *,
        state_dir: Path,
        cluster: RayCluster | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.section = section
        self.spec = spec
        self.cluster = cluster or RayCluster(section)
        self.state_file = Path(state_dir) / "ray-retired.json"
        self.placed: set[str] = set()  # Ray node ids we keep a gateway on
        self.retired: dict[str, float | None] = self._load_retired()  # Ray node id -> deadline
        self.host: NodeHost | None = None
        self.clock = clock
        self._missing: dict[str, int] = {}  # Ray node id -> rounds its gateway's name was gone
        self._spent: dict[str, tuple[int, float]] = {}  # Ray node id -> (times, last time)
        self._replacing: list[str] = []  # gateway node ids gone for good this round
        self._loop: asyncio.Task[None] | None = None

    # -- NodeProvider ----------------------------------------------------------------------

    async def start(self, host: NodeHost) -> None:
        self.host = host
        self.placed |= await asyncio.to_thread(self.cluster.existing)
        self._loop = asyncio.create_task(self._reconcile_loop(), name="ray-node-provider")

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)

    async def reconcile(self) -> list[str]:
        lost, retired = await asyncio.to_thread(self._reconcile)
        replacing, self._replacing = self._replacing, []
        if self.host is not None:
            for node_id in retired:
                await self.host.node_retired(node_id)
            if self.section.report_node_loss:
                for node_id, reason in lost.items():
                    await self.host.node_lost(node_id, reason)
            # Before the replacement is placed (a later round): it may not find the credential
            # file (its predecessor died before writing it, the work dir was wiped), and the
            # enrolment secret alone would be refused for an id with a credential on record.
            for node_id in replacing:
                await self.host.forget_credential(node_id)
        return list(lost)

    def refuse(self, request: TaskRequest) -> str | None:
        kind = request.runtime.kind
        if kind in unsandboxed_runtimes() and not self.section.gateways.allow_unsandboxed:
            return refusal(kind)
        return None

    # -- draining --------------------------------------------------------------------------

    def retire(self, node_id: str, deadline_s: float | None) -> bool:
        """Keep no gateway on ``node_id``'s Ray node from now on; it goes once it owes nothing
        (or past ``deadline_s``). False: no such gateway."""
        ray_node = next((r for r in self.placed if gateway_node_id(r) == node_id), None)
        if ray_node is None:
            return False
        self.retired[ray_node] = None if deadline_s is None else time.time() + deadline_s
        self._save_retired()
        return True

    # -- one round -------------------------------------------------------------------------

    def _reconcile(self) -> tuple[dict[str, str], list[str]]:
        """One round against Ray; the nodes lost (with why) and the gateways retired."""
        nodes = self.cluster.nodes()
        alive = {n["NodeID"] for n in nodes if n.get("Alive")}
        lost: dict[str, str] = {}
        for ray_node in sorted(self.placed - alive):
            self.placed.discard(ray_node)
            self.cluster.remove(ray_node)
            lost[gateway_node_id(ray_node)] = "Ray reports its node dead"
            log_event(
                log,
                "ray.node_lost",
                f"Ray node {ray_node} is gone; gateway {gateway_node_id(ray_node)} lost",
                level=logging.WARNING,
                node_id=gateway_node_id(ray_node),
            )
        # A gateway gone for good is replaced from the next round on: its loss is reported
        # first, so the replacement's registration is never the one declared lost.
        gone = self._gone_for_good()
        for ray_node in gone:
            lost[gateway_node_id(ray_node)] = self._spend(ray_node)
        self._replacing = [gateway_node_id(ray_node) for ray_node in gone]
        retired = []
        for node in nodes:
            ray_node = node["NodeID"]
            if ray_node not in alive or not self._eligible(node):
                continue
            if ray_node in self.retired:
                if self._finish_drain(ray_node):
                    retired.append(gateway_node_id(ray_node))
            elif ray_node not in self.placed and ray_node not in gone and self._may_place(ray_node):
                self.cluster.place(ray_node, self.spec)
                self.placed.add(ray_node)
                log_event(
                    log,
                    "ray.gateway_placed",
                    f"gateway {gateway_node_id(ray_node)} placed on Ray node {ray_node}",
                    node_id=gateway_node_id(ray_node),
                )
        return lost, retired

    # -- gateways gone for good while their node lives --------------------------------------

    def _gone_for_good(self) -> list[str]:
        """Placed gateways whose actor name Ray no longer knows: dead past their restarts (a
        restarting actor keeps its name), though their node is alive."""
        if not self.placed:
            return []
        names = self.cluster.gateway_names()
        gone = []
        for ray_node in sorted(self.placed):
            if _actor_name(ray_node) in names:
                self._missing.pop(ray_node, None)
                continue
            self._missing[ray_node] = self._missing.get(ray_node, 0) + 1
            if self._missing[ray_node] >= _MISSING_ROUNDS:
                del self._missing[ray_node]
                self.placed.discard(ray_node)
                gone.append(ray_node)
        return gone

    def _spend(self, ray_node: str) -> str:
        """Note a gateway gone for good (for the replacement backoff); why its node is lost."""
        now = self.clock()
        times, last = self._spent.get(ray_node, (0, now))
        times = 1 if now - last > _REPLACE_RESET_S else times + 1
        self._spent[ray_node] = (times, now)
        budget = self.section.gateways.max_restarts
        reason = f"its gateway died for good after using up its restarts (max_restarts {budget})"
        log_event(
            log,
            "ray.gateway_gone",
            f"gateway {gateway_node_id(ray_node)} on live Ray node {ray_node}: {reason}; "
            f"replacing it in {self._replace_delay(times):g}s",
            level=logging.WARNING,
            node_id=gateway_node_id(ray_node),
            replacements=times,
        )
        return reason

    def _may_place(self, ray_node: str) -> bool:
        spent = self._spent.get(ray_node)
        if spent is None:
            return True
        times, last = spent
        return self.clock() - last >= self._replace_delay(times)

    @staticmethod
    def _replace_delay(times: int) -> float:
        return 0.0 if times <= 1 else min(_REPLACE_MAX_S, _REPLACE_BACKOFF_S * 2 ** (times - 2))

    def _eligible(self, node: dict[str, Any]) -> bool:
        have = node.get("Resources") or {}
        wanted = self.section.gateways.resources
        return all(have.get(name, 0) >= amount for name, amount in wanted.items())

    def _finish_drain(self, ray_node: str) -> bool:
        """Stop a draining node's gateway once it owes nothing (or is past its deadline);
        True when it was stopped in this round."""
        if ray_node not in self.placed:
            return False
        deadline = self.retired[ray_node]
        owes = self.host.unfinished_on(gateway_node_id(ray_node)) if self.host else 0
        if owes == 0 or (deadline is not None and time.time() > deadline + _DRAIN_MARGIN_S):
            self.cluster.remove(ray_node)
            self.placed.discard(ray_node)
            log_event(
                log,
                "ray.gateway_retired",
                f"gateway {gateway_node_id(ray_node)} drained and stopped",
                node_id=gateway_node_id(ray_node),
            )
            return True
        return False

    async def _reconcile_loop(self) -> None:
        while True:
            try:
                await self.reconcile()
            except Exception as exc:  # a GCS hiccup must not end reconciling
                log_event(
                    log,
                    "ray.reconcile_failed",
                    f"node provider round failed: {exc!r}",
                    level=logging.ERROR,
                    exc_info=True,
                    error=repr(exc),
                )
            await asyncio.sleep(self.section.reconcile_s)

    def _load_retired(self) -> dict[str, float | None]:
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): v for k, v in data.items()} if isinstance(data, dict) else {}

    def _save_retired(self) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps(self.retired))


class RayCluster:
    """The few Ray calls the provider makes (a test replaces this with a fake)."""

    def __init__(self, section: RaySection) -> None:
        self.section = section

    def nodes(self) -> list[dict[str, Any]]:
        import ray

        return list(ray.nodes())

    def gateway_names(self) -> set[str]:
        """Polar's gateway actor names Ray knows: alive or restarting; one that died past its
        restarts (or was killed) has lost its name."""
        import ray

        return {
            entry["name"]
            for entry in ray.util.list_named_actors(all_namespaces=True)
            if entry.get("namespace") == self.section.namespace
            and entry["name"].startswith(GATEWAY_ACTOR_PREFIX)
        }

    def existing(self) -> set[str]:
        """Ray node ids (12-character prefixes resolved) that already have a gateway actor."""
        names = self.gateway_names()
        return {
            n["NodeID"] for n in self.nodes() if _actor_name(n["NodeID"]) in names and n["Alive"]
        }

    def place(self, ray_node: str, spec: GatewaySpec) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        gateways = self.section.gateways
        remote: Any = ray.remote(GatewayActor)
        actor = remote.options(
            name=_actor_name(ray_node),
            namespace=self.section.namespace,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            resources=dict(gateways.resources),
            max_restarts=gateways.max_restarts,
            # Hard affinity: a crashed gateway comes back on its own node, never elsewhere.
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node, soft=False),
        )
        actor.remote(spec.model_dump_json())

    def remove(self, ray_node: str) -> None:
        import ray

        try:
            ray.kill(
                ray.get_actor(_actor_name(ray_node), namespace=self.section.namespace),
                no_restart=True,
            )
        except ValueError:
            return  # gone already


def _actor_name(ray_node: str) -> str:
    return f"{GATEWAY_ACTOR_PREFIX}{ray_node[:12]}"


node_providers.add("ray", RayNodeProvider)
