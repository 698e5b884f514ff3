"""The rollout server's live dashboard (``GET /dashboard``): nodes, tasks, throughput, and each
session's trajectory turn by turn.

Pages are rendered on the server from Jinja templates; one small script (``static/dashboard.js``,
no build step, nothing fetched from anywhere but this server) follows ``GET /events`` and
re-renders a page's live part from the server when something happens. Every route is a GET
that changes nothing; the viewer token (see :mod:`polar.rollout.access`) opens them.
"""

from urllib.parse import quote

from polar.rollout.access import viewer_token
from polar.rollout.dashboard.routes import router

__all__ = ["router", "sign_in_url"]


def sign_in_url(server_url: str, admin_token: str | None) -> str:
    """The link that opens the dashboard of the server at ``server_url`` whose admin token is
    ``admin_token``: it carries the read-only viewer token, never the admin token. Without a
    token, the sign-in page (which goes straight on to the dashboard when auth is off)."""
    login = server_url.rstrip("/") + "/dashboard/login"
    if admin_token is None:
        return login
    return f"{login}?token={quote(viewer_token(admin_token))}"
