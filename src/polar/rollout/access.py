"""Who may call the rollout server, decided from the request's headers alone.

- The admin token (trainers, the CLI, operators): every route, and enrolling a node.
- The enrolment secret: ``POST /nodes/register`` only, and only for an id with no credential on
  record: a known id (after a server restart, after its node was declared dead) registers again
  only with its own credential or the admin token, until an operator retires it.
- A node's credential, issued when it enrols: that node's register, heartbeat and drain, and
  ``POST /results`` for the sessions dispatched to it (the routes check which node it is).
- The viewer token, derived from the admin token (an HMAC of it, so it survives a restart and
  reveals nothing of the admin token): the dashboard's pages (``GET /dashboard...``) and the
  event stream, nothing else. ``/dashboard/login`` exchanges either token for an HttpOnly cookie
  holding the viewer token (:class:`polar.auth.TokenGuard` reads it on GET and HEAD only).

Credentials are random; the server keeps only their digests (SQLite), so a restart keeps them
and a copy of the database does not leak them. :class:`polar.auth.TokenGuard` runs
:meth:`Access.authorize` before any body is read.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

from polar.auth import OPEN, same_secret
from polar.rollout.store import RolloutStore
from polar.tokens import digest, new_token

ADMIN = "admin"
ENROL = "enrol"
VIEWER = "viewer"
# What a node's credential opens (and the enrolment secret: only the first).
_NODE_ROUTES = re.compile(r"/nodes/register|/nodes/[^/]+/(heartbeat|drain)|/results")
# What the viewer token opens: every dashboard route is a GET that changes nothing.
_VIEW_ROUTES = re.compile(r"/dashboard(/.*)?|/events")
# The login page checks the token it is given itself; the dashboard's script and style are
# the same for everyone. None reveals anything of the server.
_OPEN_ROUTES = frozenset(
    {
        "/health",
        "/dashboard/login",
        "/dashboard/static/dashboard.js",
        "/dashboard/static/dashboard.css",
    }
)


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
        self.viewer_token = viewer_token(admin_token) if admin_token else None
        # Named after the server's own secret: servers on one host (ports do not separate
        # cookies) each keep their own.
        self.viewer_cookie = (
            f"polar-viewer-{digest(self.viewer_token)[:12]}" if self.viewer_token else None
        )
        self._nodes_by_digest = {d: node for node, d in store.node_credentials().items()}

    def authorize(self, path: str, token: str | None) -> str | NodeCaller | None:
        """The caller ``token`` makes of a request for ``path``; None: refuse (401)."""
        if self.admin_token is None or path in _OPEN_ROUTES:
            return OPEN
        if same_secret(token, self.admin_token):
            return ADMIN
        if token is None:
            return None
        if _VIEW_ROUTES.fullmatch(path):
            return VIEWER if same_secret(token, self.viewer_token) else None
        if not _NODE_ROUTES.fullmatch(path):
            return None
        if path == "/nodes/register" and same_secret(token, self.enrolment_secret):
            return ENROL
        node_id = self._nodes_by_digest.get(digest(token))
        return NodeCaller(node_id, token) if node_id is not None else None

    def may_view(self, token: str | None) -> bool:
        """Whether ``token`` is the admin or the viewer token."""
        return same_secret(token, self.admin_token) or same_secret(token, self.viewer_token)

    def has_credential(self, node_id: str) -> bool:
        """Whether ``node_id`` was issued a credential that is still on record."""
        return node_id in self._nodes_by_digest.values()

    def retire(self, node_id: str) -> bool:
        """Revoke ``node_id``'s credential, so the id may enrol anew; False if it had none.
        Blocking (SQLite)."""
        found = self.store.delete_node_credential(node_id)
        self._nodes_by_digest = {d: n for d, n in self._nodes_by_digest.items() if n != node_id}
        return found

    def issue(self, node_id: str) -> str:
        """A new credential for ``node_id`` (the old one stops working). Blocking (SQLite)."""
        credential = new_token()
        found = digest(credential)
        self.store.set_node_credential(node_id, found)
        self._nodes_by_digest = {
            d: node for d, node in self._nodes_by_digest.items() if node != node_id
        } | {found: node_id}
        return credential


def viewer_token(admin_token: str) -> str:
    """The read-only token of a server whose admin token is ``admin_token``."""
    return hmac.new(admin_token.encode(), b"polar dashboard viewer", hashlib.sha256).hexdigest()
