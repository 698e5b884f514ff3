"""Run inside a sandbox as its harness: try every way out the issue lists (stdlib only).

Writes escapes.json: per attempt, what it got (an HTTP status, or "unreachable") and the head
of the answer, plus the uid it ran as and whether /etc/shadow was readable. The attempts go
through the model-API address the sandbox was given (the relay) unless they name the node's or
the rollout server's own URL (NODE_URL, ROLLOUT_URL), which must be unreachable from inside.
VICTIM_KEY is another live session's key on the same node.
"""

import json
import os
import urllib.error
import urllib.parse
import urllib.request

BASE = os.environ["OPENAI_BASE_URL"]  # http://127.0.0.1:<port>/s/<own key>/v1
OWN = os.environ["OPENAI_API_KEY"]
VICTIM = os.environ["VICTIM_KEY"]
NODE = os.environ["NODE_URL"]
ROLLOUT = os.environ["ROLLOUT_URL"]
ROOT = "{0.scheme}://{0.netloc}".format(urllib.parse.urlsplit(BASE))
CHAT = {"model": "polar", "messages": [{"role": "user", "content": "hi"}]}
LOCAL_TASK = {
    "task_id": "escape",
    "instruction": "x",
    "runtime": {"kind": "local"},
    "agent": {"harness": "shell", "settings": {"command": "touch /tmp/polar-escaped"}},
}
DISPATCH = {"session_id": "escape-0123456789abcdef", "task": LOCAL_TASK}
FORGED = {"session_id": OWN, "task_id": "escape", "status": "COMPLETED", "reward": 1.0}


def bearer(key):
    return {"authorization": "Bearer " + key}


# name: (method, url, JSON body or None, headers)
ATTEMPTS = {
    "list_sessions": ("GET", ROOT + "/polar/sessions", None, {}),
    "list_sessions_own_prefix": ("GET", f"{ROOT}/s/{OWN}/polar/sessions", None, bearer(OWN)),
    "docs": ("GET", ROOT + "/docs", None, {}),
    "openapi": ("GET", ROOT + "/openapi.json", None, {}),
    "victim_key_in_path": ("POST", f"{ROOT}/s/{VICTIM}/v1/chat/completions", CHAT, bearer(VICTIM)),
    "victim_key_in_bearer": ("POST", BASE + "/chat/completions", CHAT, bearer(VICTIM)),
    "victim_key_in_x_api_key": ("POST", BASE + "/chat/completions", CHAT, {"x-api-key": VICTIM}),
    "victim_key_in_query": ("POST", f"{BASE}/chat/completions?key={VICTIM}", CHAT, {}),
    "node_dispatch": ("POST", ROOT + "/polar/node/sessions", DISPATCH, {}),
    "node_status": ("GET", ROOT + "/polar/node/status", None, {}),
    "pause": ("POST", ROOT + "/polar/pause", {"timeout_s": 0}, {}),
    "rollout_route_via_relay": ("POST", ROOT + "/tasks", LOCAL_TASK, {}),
    "forged_result_via_relay": ("POST", ROOT + "/results", FORGED, {}),
    "node_direct": ("GET", NODE + "/polar/sessions", None, {}),
    "rollout_direct": ("POST", ROLLOUT + "/tasks", LOCAL_TASK, {}),
    "forged_result_direct": ("POST", ROLLOUT + "/results", FORGED, {}),
    "own_call": ("POST", BASE + "/chat/completions", CHAT, bearer(OWN)),
}


def attempt(method, url, body, headers):
    data = None if body is None else json.dumps(body).encode()
    headers = {"content-type": "application/json", **headers}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:  # refused, unreachable, timed out
        return "unreachable", repr(exc)


def main():
    found = {}
    for name, args in ATTEMPTS.items():
        outcome, answer = attempt(*args)
        found[name] = {"got": outcome, "answer": answer[:60], "leaks_victim": VICTIM in answer}
    try:
        with open("/etc/shadow") as shadow:
            shadow_readable = bool(shadow.read(1) or True)
    except OSError:
        shadow_readable = False
    report = {"attempts": found, "uid": os.getuid(), "shadow_readable": shadow_readable}
    with open("escapes.json", "w") as out:
        json.dump(report, out, separators=(",", ":"))


main()
