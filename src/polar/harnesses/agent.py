"""The bundled minimal agent: a short loop over chat completions with one shell tool.

``polar quickstart`` runs it when npm is missing (so Pi cannot be installed). It is a real
harness run through the ``shell`` preset: the preset points ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY`` at the session, and the agent neither knows nor cares that a gateway sits
there. Standard library only, so any ``python3`` in any runtime runs it.

Usage: ``python3 agent.py [--max-turns N] INSTRUCTION [FOLLOW_UP ...]``. Each turn asks the
model and acts on the reply: a ``shell`` tool call runs in the working directory and its output
goes back as the tool result; a reply without tool calls but with a fenced ``bash`` block runs
that block (the action format of mini-SWE-agent, and what small models write far more often
than tool calls) and its output goes back as the next user message; any other reply answers the
current message: the next follow-up (if any) is then sent in the same conversation, and the
answer to the last one is the final answer. ``--max-turns`` bounds the model calls in all. The
exit status is 0 whenever the loop ran (success is the evaluator's call), 2 on bad usage, 1
when the model API fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

SYSTEM = (
    "You are a coding agent working in the current directory. To run a shell command, call "
    "the shell tool, or reply with the command in a bash code block, for example:\n"
    "```bash\nls -l\n```\n"
    "You will see its output. When the task is done, reply with a one-line summary and no "
    "code block."
)
TOOL = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a bash command in the working directory; returns its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command."}},
            "required": ["command"],
        },
    },
}
DEFAULT_MAX_TURNS = 4
COMMAND_TIMEOUT_S = 30
OUTPUT_LIMIT = 2000
API_TIMEOUT_S = 600
FENCED_BASH = re.compile(r"```(?:bash|sh|shell|console)[ \t]*\n(.*?)```", re.DOTALL)


def complete(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One chat completion from the configured base URL; returns the assistant message."""
    body = {"model": os.environ.get("POLAR_MODEL", "polar"), "messages": messages, "tools": [TOOL]}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
            "content-type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=API_TIMEOUT_S) as reply:
        message: dict[str, Any] = json.load(reply)["choices"][0]["message"]
        return message


def run_tool(call: dict[str, Any]) -> str:
    """The shell tool; a malformed call gets an explanation back instead of a crash."""
    function = call.get("function") or {}
    if function.get("name") != "shell":
        return f"error: unknown tool {function.get('name')!r}; the only tool is shell"
    try:
        command = json.loads(function.get("arguments") or "{}")["command"]
    except (ValueError, KeyError, TypeError):
        return 'error: arguments must be JSON like {"command": "ls"}'
    return run_command(str(command))


def run_command(command: str) -> str:
    """``command`` under bash in the working directory: its output and exit status."""
    try:
        done = subprocess.run(
            ["bash", "-c", command],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"error: the command ran past {COMMAND_TIMEOUT_S}s and was stopped"
    output = (done.stdout + done.stderr)[-OUTPUT_LIMIT:].rstrip("\n")
    return f"{output}\n[exit {done.returncode}]".lstrip("\n")


def fenced_command(text: str | None) -> str | None:
    """The first fenced bash block of a reply, if it has one."""
    match = FENCED_BASH.search(text or "")
    return match.group(1).strip() if match and match.group(1).strip() else None


def agent_loop(instruction: str, max_turns: int, follow_ups: list[str] | None = None) -> str:
    """Ask, act, repeat; returns the final answer (or a note that the turns ran out)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": instruction},
    ]
    pending = list(follow_ups or [])
    for turn in range(1, max_turns + 1):
        message = complete(messages)
        calls = message.get("tool_calls") or []
        content = message.get("content")
        messages.append(
            {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
        )
        if calls:
            for call in calls:
                output = run_tool(call)
                print(f"[turn {turn}] tool call -> {output[:200]}")
                messages.append(
                    {"role": "tool", "tool_call_id": call.get("id", ""), "content": output}
                )
        elif (command := fenced_command(content)) is not None:
            output = run_command(command)
            print(f"[turn {turn}] bash block -> {output[:200]}")
            messages.append({"role": "user", "content": f"Output of your command:\n{output}"})
        elif pending:
            messages.append({"role": "user", "content": pending.pop(0)})
        else:
            return str(content or "")
    return f"(stopped after {max_turns} turns)"


def main(argv: list[str]) -> int:
    args = list(argv)
    max_turns = DEFAULT_MAX_TURNS
    if args[:1] == ["--max-turns"] and len(args) >= 2 and args[1].isdigit():
        max_turns, args = max(1, int(args[1])), args[2:]
    if not args:
        print("usage: agent.py [--max-turns N] INSTRUCTION [FOLLOW_UP ...]", file=sys.stderr)
        return 2
    try:
        print(agent_loop(args[0], max_turns, args[1:]))
    except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
        print(f"model API call failed: {exc!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
