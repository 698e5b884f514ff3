"""``polar.ray.up(config) -> PolarRay``: Polar on a Ray cluster that already exists.

It joins the cluster (``ray.address`` or RAY_ADDRESS; never starts one unless
``ray.start_local``), starts the rollout server actor on the node holding the rollout resource,
and from then on the rollout server's node provider keeps one gateway per gateway node. Inside
a trainer's driver that already called ``ray.init``, it uses that connection. Polar's actors
are named and live in their own namespace; :meth:`PolarRay.down` kills those and nothing else.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from polar.errors import ConfigError, PolarError
from polar.ray.actors import RolloutActor
from polar.ray.config import GATEWAY_ACTOR_PREFIX, ROLLOUT_ACTOR, PolarRayConfig
from polar.schemas.rollout import NodeView


def connect(config: PolarRayConfig) -> None:
    """Join the cluster the config names (or keep the driver's connection)."""
    import ray

    if ray.is_initialized():
        return
    address = config.ray.resolved_address()
    # The namespace is given on every named-actor call, so a trainer's driver keeps its own.
    ray.init(address=address, namespace=config.ray.namespace, log_to_driver=False)


def up(config: PolarRayConfig | dict[str, Any] | str | Path) -> PolarRay:
    """Start (or find, if already up) Polar's rollout server on the cluster; its gateways
    follow on every gateway node. Returns once the rollout server answers."""
    import ray

    config = _load(config)
    connect(config)
    section = config.ray
    rollout = config.rollout.model_copy(update={"data_dir": config.rollout.data_dir.absolute()})
    config = config.model_copy(update={"rollout": rollout})
    remote: Any = ray.remote(RolloutActor)
    actor = remote.options(
        name=ROLLOUT_ACTOR,
        namespace=section.namespace,
        get_if_exists=True,
        lifetime="detached" if section.detached else None,
        num_cpus=0,
        resources=dict(section.rollout.resources),
        max_restarts=section.rollout.max_restarts,
        max_task_retries=-1 if section.rollout.max_restarts else 0,
    )
    handle: Any = actor.remote(config.model_dump_json())
    try:
        where: dict[str, Any] = ray.get(handle.where.remote(), timeout=120)
    except ray.exceptions.GetTimeoutError as exc:
        raise PolarError(
            "the rollout server actor was not placed within 120 s: does a node carry "
            f"{dict(section.rollout.resources)} (ray start --resources)?"
        ) from exc
    token = ray.get(handle.token.remote())
    return PolarRay(handle, where["url"], token, section.namespace)


def attach(config: PolarRayConfig | dict[str, Any] | str | Path) -> PolarRay:
    """The Polar already running on the cluster (``polar ray status | drain``)."""
    import ray

    config = _load(config)
    connect(config)
    try:
        handle: Any = ray.get_actor(ROLLOUT_ACTOR, namespace=config.ray.namespace)
    except ValueError as exc:
        raise PolarError(
            f"no Polar on this cluster (no actor {ROLLOUT_ACTOR!r} in namespace "
            f"{config.ray.namespace!r}): start it with `polar ray up`"
        ) from exc
    where: dict[str, Any] = ray.get(handle.where.remote(), timeout=60)
    return PolarRay(handle, where["url"], ray.get(handle.token.remote()), config.ray.namespace)


def down(namespace: str = "polar", settle_s: float = 20.0) -> list[str]:
    """Kill Polar's named actors in ``namespace`` (the rollout server first, so nothing starts
    a gateway again) and nothing else; returns their names. Never stops Ray itself.

    Waits, up to ``settle_s``, until none is listed any more, killing any that appears
    meanwhile: a gateway the rollout server was creating when the listing was taken comes up
    after it, detached, and would outlive everything else."""
    import ray

    killed: list[str] = []  # a name is unique among live actors, and nothing reuses a killed one
    deadline = time.monotonic() + settle_s
    while True:
        listed = _polar_actors(namespace)
        for name in listed:
            if name in killed:
                continue  # still dying
            try:
                ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
            except ValueError:
                continue  # gone meanwhile
            killed.append(name)
        if not listed or time.monotonic() >= deadline:
            return killed
        time.sleep(0.2)


def _polar_actors(namespace: str) -> list[str]:
    """Polar's live named actors in ``namespace``, the rollout server first."""
    import ray

    names = [
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry.get("namespace") == namespace
        and (entry["name"] == ROLLOUT_ACTOR or entry["name"].startswith(GATEWAY_ACTOR_PREFIX))
    ]
    return sorted(names, key=lambda name: name != ROLLOUT_ACTOR)


class PolarRay:
    """A handle on Polar running on Ray; every call but :meth:`down` is HTTP to the server."""

    def __init__(self, actor: Any, rollout_url: str, admin_token: str | None, namespace: str):
        self.actor = actor
        self.rollout_url = rollout_url
        self.admin_token = admin_token
        self.namespace = namespace

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}

    def nodes(self) -> list[NodeView]:
        reply = httpx.get(f"{self.rollout_url}/nodes", headers=self.headers, timeout=10)
        reply.raise_for_status()
        return [NodeView.model_validate(n) for n in reply.json()]

    def wait_nodes(self, count: int, timeout_s: float | None = 60.0) -> list[NodeView]:
        """Wait until ``count`` gateways are registered and healthy (``timeout_s`` None: for
        as long as it takes; a cluster still scaling up may need minutes)."""
        started = time.monotonic()
        while True:
            healthy = [n for n in self.nodes() if n.healthy]
            if len(healthy) >= count:
                return healthy
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                raise PolarError(f"{len(healthy)} of {count} gateways up after {timeout_s:g}s")
            time.sleep(0.1)

    def drain(self, node_id: str, deadline_s: float | None = None) -> NodeView:
        """Send no more work to ``node_id``; what it still runs at ``deadline_s`` ends as an
        infra failure. Its gateway then stops and is not started there again."""
        import ray

        params = {"deadline_s": deadline_s} if deadline_s is not None else {}
        reply = httpx.post(
            f"{self.rollout_url}/nodes/{node_id}/drain",
            params=params,
            headers=self.headers,
            timeout=10,
        )
        if reply.status_code == 404:
            raise ConfigError(f"no node {node_id!r} (see `polar ray status`)")
        reply.raise_for_status()
        ray.get(self.actor.retire.remote(node_id, deadline_s), timeout=30)
        return NodeView.model_validate(reply.json())

    def down(self) -> list[str]:
        return down(self.namespace)


def _load(config: PolarRayConfig | dict[str, Any] | str | Path) -> PolarRayConfig:
    if isinstance(config, PolarRayConfig):
        return config
    if isinstance(config, dict):
        return PolarRayConfig.parse(config)
    return PolarRayConfig.from_yaml(config)
