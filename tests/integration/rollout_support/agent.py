"""A small scripted agent (stdlib only, so any python3 in a sandbox runs it).

It calls the gateway's chat completions with OPENAI_BASE_URL / OPENAI_API_KEY, runs each shell
tool call it gets, sends the output back, and stops at the first plain-text answer.
AGENT_MODE changes its behaviour for fault tests: ``crash`` exits 7 after the first call,
``hang`` sleeps after the first call (to run past the session budget), ``stubborn`` sleeps
when the gateway answers with an error instead of exiting (a harness that keeps retrying).
"""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command in the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


def complete(messages):
    body = {"model": "polar", "messages": messages, "tools": TOOLS}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
            "content-type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.load(reply)["choices"][0]["message"]
    except urllib.error.HTTPError:
        if os.environ.get("AGENT_MODE") == "stubborn":
            time.sleep(3600)
        raise


def main():
    mode = os.environ.get("AGENT_MODE", "normal")
    messages = [{"role": "user", "content": sys.argv[1]}]
    for _ in range(4):
        message = complete(messages)
        if mode == "crash":
            print("agent crashed on purpose", file=sys.stderr)
            sys.exit(7)
        if mode == "hang":
            time.sleep(3600)
        messages.append(
            {k: message[k] for k in ("role", "content", "tool_calls") if message.get(k)}
        )
        calls = message.get("tool_calls") or []
        if not calls:
            print(message.get("content"))
            return
        for call in calls:
            command = json.loads(call["function"]["arguments"])["command"]
            done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=30)
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": done.stdout + done.stderr}
            )
    sys.exit(3)


if __name__ == "__main__":
    main()
