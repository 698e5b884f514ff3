"""Who may call the rollout server, decided from the request's headers alone.

- The admin token (trainers, the CLI, operators): every route, and enrolling a node.
- The enrolment secret: ``POST /nodes/register`` only.
- A node's credential, issued when it enrols: that node's register, heartbeat and drain, and
  ``POST /results`` for the sessions dispatched to it (the routes check which node it is).

Credentials are random; the server keeps only their digests (SQLite), so a restart keeps them
and a copy of the database does not leak them. :class:`polar.auth.TokenGuard` runs
:meth:`Access.authorize` before any body is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from polar.auth import OPEN, same_secret
from polar.rollout.store import RolloutStore
from polar.tokens import digest, new_token

ADMIN = "admin"
ENROL = "enrol"
# What a node's credential opens (and the enrolment secret: only the first).
_NODE_ROUTES = re.compile(r"/nodes/register|/nodes/[^/]+/(heartbeat|drain)|/results")
_OPEN_ROUTES = frozenset({"/health"})


@dataclass(frozen=True)
class NodeCaller:
    """A request carrying the credential issued to ``node_id``."""

    node_id: str
    credential: str


class Access:
    """The server's secrets: ``admin_token`` None means auth is off (loopback only)."""

    def __init__(
        self, store: RolloutStore, admin_token: str | None, enrolment_secret: str | None
    ) -> None:
        self.store = store
        self.admin_token = admin_token
        self.enrolment_secret = enrolment_secret
        self._nodes_by_digest = {d: node for node, d in store.node_credentials().items()}

    def authorize(self, path: str, token: str | None) -> str | NodeCaller | None:
        """The caller ``token`` makes of a request for ``path``; None: refuse (401)."""
        if self.admin_token is None or path in _OPEN_ROUTES:
            return OPEN
        if same_secret(token, self.admin_token):
            return ADMIN
        if token is None or not _NODE_ROUTES.fullmatch(path):
            return None
        if path == "/nodes/register" and same_secret(token, self.enrolment_secret):
            return ENROL
        node_id = self._nodes_by_digest.get(digest(token))
        return NodeCaller(node_id, token) if node_id is not None else None

    def issue(self, node_id: str) -> str:
        """A new credential for ``node_id`` (the old one stops working). Blocking (SQLite)."""
        credential = new_token()
        found = digest(credential)
        self.store.set_node_credential(node_id, found)
        self._nodes_by_digest = {
            d: node for d, node in self._nodes_by_digest.items() if node != node_id
        } | {found: node_id}
        return credential
