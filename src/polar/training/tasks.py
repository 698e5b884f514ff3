"""Where a trainer's tasks come from: a task source by name or ``module:function``.

A task source is a callable ``(split, step, count, seed) -> list[TaskRequest]``; ``split`` is
``"train"`` or ``"eval"`` and the eval split must not overlap the train split. The bundled
``arithmetic`` family is the learning benchmark's toy: a one-call agent asks the model to add
two numbers, and the session passes when the last number in the reply is the sum. SmolLM2-135M
often answers in prose, with a wrong number, or with none, so it starts low but not at zero;
replies that spell out ``a + b = c`` are right far more often, which gives GRPO a path to climb.
The bundled ``tool_use`` family (:mod:`polar.training.tool_use`) asks a real harness for
workspace chores only a tool call can do.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Literal

from polar.registry import Registry
from polar.schemas.task import TaskRequest
from polar.training.tool_use import tool_use

Split = Literal["train", "eval"]
TaskSource = Callable[..., list[TaskRequest]]

# The agent: one chat-completions call through the gateway, the reply's text into answer.txt.
# Standard library only, so any python3 in any runtime runs it.
ONE_CALL_AGENT = """\
import json, os, sys, urllib.request

body = {"model": "polar", "messages": [{"role": "user", "content": sys.argv[1]}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "content-type": "application/json"},
)
with urllib.request.urlopen(request, timeout=600) as reply:
    content = json.load(reply)["choices"][0]["message"].get("content") or ""
open("answer.txt", "w").write(content)
"""

# Passes when the reply's last number is the expected one.
_GRADER = (
    "python3 -c \"import re, sys; n = re.findall(r'-?[0-9]+', open('answer.txt').read()); "
    "sys.exit(0 if n and n[-1] == '{answer}' else 1)\""
)

ARITHMETIC_PROMPT = "What is {a} + {b}?"


def arithmetic(
    split: Split,
    step: int,
    count: int,
    seed: int = 0,
    *,
    low: int = 1,
    high: int = 15,
    num_samples: int = 4,
    timeout_s: float = 300.0,
    runtime: str | None = None,
) -> list[TaskRequest]:
    """``count`` addition tasks; pairs with ``(a * 7 + b) % 5 == 0`` are held out for eval."""
    rng = random.Random(f"{seed}:{split}:{step}")
    pairs = [
        (a, b)
        for a in range(low, high + 1)
        for b in range(low, high + 1)
        if ((a * 7 + b) % 5 == 0) == (split == "eval")
    ]
    if split == "eval":  # distinct held-out pairs (cycling only if more are asked for)
        rng.shuffle(pairs)
        chosen = [pairs[i % len(pairs)] for i in range(count)]
    else:
        chosen = [pairs[rng.randrange(len(pairs))] for _ in range(count)]
    tasks = []
    for i, (a, b) in enumerate(chosen):
        runtime_spec: dict[str, Any] = {"files": {"agent.py": ONE_CALL_AGENT}}
        if runtime:
            runtime_spec["kind"] = runtime
        tasks.append(
            TaskRequest.model_validate(
                {
                    "task_id": f"{split}-{seed}-{step}-{i}",
                    "instruction": ARITHMETIC_PROMPT.format(a=a, b=b),
                    "num_samples": num_samples,
                    "timeout_seconds": timeout_s,
                    "runtime": runtime_spec,
                    "agent": {
                        "harness": "shell",
                        "settings": {"command": "python3 agent.py {instruction}"},
                    },
                    "builder": {"strategy": "prefix_merging"},
                    "evaluator": {
                        "strategy": "test_on_output",
                        "config": {"command": _GRADER.format(answer=a + b), "timeout_s": 30},
                    },
                    "metadata": {"answer": a + b},
                }
            )
        )
    return tasks


def swe(split: Split, step: int, count: int, seed: int = 0, **options: Any) -> list[TaskRequest]:
    """SWE-bench-format tasks graded by their tests: the bundled set, or ``instances`` (a file,
    directory or cached Hub dataset); see :func:`polar.swe.task_source.swe_task_source`."""
    from polar.swe.task_source import swe_task_source

    return swe_task_source(split, step, count, seed, **options)


task_sources: Registry[list[TaskRequest]] = Registry("task source")
task_sources.add("arithmetic", arithmetic)
task_sources.add("swe", swe)
task_sources.add("tool_use", tool_use)


def task_source(name: str) -> TaskSource:
    """The task source ``name`` names (a bundled one, or ``module:function``)."""
    return task_sources.get(name)
