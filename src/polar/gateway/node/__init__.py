"""The gateway's node wing: what a rollout node runs beside the proxy.

The lifecycle pools (``lifecycle.py``), a session's record (``node_session.py``) and stage
bodies (``session_work.py``), the thread pools evaluators run on (``executors.py``), the run
side of a session's call budget (``call_budget.py``), the node API a rollout server drives
(``node_api.py``) and the node's client of that server (``node_client.py``). The proxy wing
(``polar.gateway``'s own modules) never imports it: only the app factory attaches it, and only
on a node, so a standalone gateway never loads the runtime, harness and evaluator stack.
"""
