"""The rollout server's live dashboard (``GET /dashboard``): nodes, tasks, throughput, and each
session's trajectory turn by turn.

Pages are rendered on the server from Jinja templates; one small script (``static/dashboard.js``,
no build step, nothing fetched from anywhere but this server) follows ``GET /events`` and
re-renders a page's live part from the server when something happens. Every route is a GET
that changes nothing; the viewer token (see :mod:`polar.rollout.access`) opens them.
"""

from polar.rollout.dashboard.routes import router

__all__ = ["router"]
