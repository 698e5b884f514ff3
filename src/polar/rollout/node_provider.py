"""Where gateway nodes come from: the seam between the rollout server and whatever starts nodes.

``static`` is the default and does nothing: nodes are started by hand (``polar serve-gateway``
from a topology) and register themselves. ``ray`` (:mod:`polar.ray.provider`) keeps one gateway
actor on every Ray node that carries the gateway resource and reports the nodes Ray sees die.
A provider only starts, stops and watches nodes: sessions, results, model calls and callbacks
travel over HTTP whichever provider runs.
"""

from __future__ import annotations

from typing import Protocol

from polar.registry import Registry
from polar.schemas.task import TaskRequest


class NodeHost(Protocol):
    """What a provider may ask of the rollout server it runs in."""

    async def node_lost(self, node_id: str, reason: str) -> int | None:
        """Fail ``node_id``'s unfinished sessions now (infra); None if the node is unknown."""
        ...

    async def node_retired(self, node_id: str) -> None:
        """The provider stopped a drained node's gateway: drained now, not dead later."""
        ...

    def unfinished_on(self, node_id: str) -> int:
        """How many sessions ``node_id`` still owes (blocking; call from a thread)."""
        ...

    async def forget_credential(self, node_id: str) -> None:
        """The provider will start a fresh gateway as ``node_id``, whose last one is gone for
        good: revoke the id's credential, so the fresh one enrols with the enrolment secret
        whether or not it finds the credential file its predecessor kept."""
        ...


class NodeProvider(Protocol):
    """Starts, watches and stops gateway nodes for one rollout server."""

    async def start(self, host: NodeHost) -> None:
        """Begin reconciling; report lost nodes through ``host.node_lost`` (at once: a node,
        or the node's gateway for good, seen gone) and retired ones through
        ``host.node_retired``."""
        ...

    async def stop(self) -> None:
        """Stop reconciling. Nodes keep running: a restarted server finds them again."""
        ...

    async def reconcile(self) -> list[str]:
        """One round: start missing nodes, report lost ones; returns the node ids lost."""
        ...

    def refuse(self, request: TaskRequest) -> str | None:
        """Why nodes of this provider may not run ``request`` (None: they may)."""
        ...


class StaticProvider:
    """Today's topology: nodes are started elsewhere and register themselves; silence past
    ``node_grace_s`` is the only loss signal."""

    async def start(self, host: NodeHost) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def reconcile(self) -> list[str]:
        return []

    def refuse(self, request: TaskRequest) -> str | None:
        return None


node_providers: Registry[NodeProvider] = Registry("node provider")
"""``static`` here; ``ray`` registers itself when :mod:`polar.ray` is imported (a layer above
the rollout server, which never imports it)."""
node_providers.add("static", StaticProvider)
