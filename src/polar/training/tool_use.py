"""The ``tool_use`` task family: small workspace chores that only a tool call can do.

Each task asks a real harness (Pi by default; any preset with a shell tool) to do one thing
in its workspace, and a ``test_on_output`` command checks the workspace afterwards, so a
reply in prose scores 0 however right it sounds:

- ``write``: "Create a file named notes.txt containing the word apple."
- ``count``: "Read data.txt and write its number of lines into answer.txt." (file seeded)
- ``run``: "Run `python3 show.py` and write what it prints into answer.txt." (script seeded)
- ``gather`` (not in the default kinds; ``kinds: [gather]``): "Read a.txt, b.txt and c.txt
  and write their words, in that order, separated by spaces, into answer.txt." (3 to 5 files
  seeded, a word each): sessions of 5 to 7 calls, for the builder ablation.

The held-out split is fixed by a hash of each task's parameters (about one in five), so no
eval task is ever trained on, whatever the seed or step. Every task carries its ``solution``
in its metadata: shell commands, one per turn, that the scripted demonstrator of a warm start
(:mod:`polar.training.sft`) runs through the harness's own shell tool. They take two tool
calls, as a careful agent would: look, then act on what the tool returned (``wc -l data.txt``,
then ``echo 7 > answer.txt``), or act, then check (``cat memo.txt``). A demonstrated session is
three model calls (two tool calls and a summary), merged into one trace; a ``gather`` one reads
each file in a call of its own, then writes the answer: N + 2 calls for N files.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from polar.errors import ConfigError
from polar.runtimes.registry import binds_host_paths
from polar.schemas.task import TaskRequest

KINDS = ("write", "count", "run")
"""The default kinds: a chore of each takes three model calls."""
LONG_KINDS = ("gather",)
"""Kinds asked for by name: a ``gather`` chore takes 5 to 7 calls (3 to 5 files)."""
WORDS = (
    "apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "piano",
    "ocean", "amber", "cedar", "delta", "ember", "frost", "grape", "honey",
)  # fmt: skip
FILES = ("notes.txt", "word.txt", "out.txt", "result.txt", "hello.txt", "memo.txt")
DATA = ("data.txt", "list.txt", "lines.txt", "items.txt")
SCRIPTS = ("show.py", "main.py", "say.py", "calc.py")
SOURCES = ("a.txt", "b.txt", "c.txt", "d.txt", "e.txt")
EVAL_SHARE = 5
"""One parameter set in ``EVAL_SHARE`` (by hash) is held out."""

_CHECK = (
    'python3 -c "import sys; t = open({path!r}).read().strip(); '
    'sys.exit(0 if t == {expected!r} else 1)"'
)


@dataclass(frozen=True)
class Chore:
    """One task's parameters, what it asks, how it is solved and what passes it."""

    kind: str
    params: tuple[Any, ...]
    instruction: str
    files: dict[str, str]
    solution: list[str]
    path: str  # the file the check reads
    expected: str

    @property
    def held_out(self) -> bool:
        key = f"{self.kind}:{self.params}".encode()
        return int(hashlib.sha256(key).hexdigest(), 16) % EVAL_SHARE == 0

    @property
    def check(self) -> str:
        return _CHECK.format(path=self.path, expected=self.expected)


def chores() -> Iterator[Chore]:
    """Every task of the family, in a fixed order."""
    for name in FILES:
        for word in WORDS:
            yield Chore(
                "write",
                (name, word),
                f"Create a file named {name} containing the word {word}.",
                {},
                [f"echo {word} > {name}", f"cat {name}"],
                name,
                word,
            )
    for data in DATA:
        for lines in range(2, 10):
            body = "".join(f"{WORDS[(i * 5 + lines) % len(WORDS)]}\n" for i in range(lines))
            yield Chore(
                "count",
                (data, lines),
                f"Read {data} and write its number of lines into answer.txt.",
                {data: body},
                [f"wc -l {data}", f"echo {lines} > answer.txt"],
                "answer.txt",
                str(lines),
            )
    for script in SCRIPTS:
        for a in range(2, 8):
            for word in WORDS[::3]:
                printed = f"{word}{a * 7}"
                yield Chore(
                    "run",
                    (script, a, word),
                    f"Run `python3 {script}` and write what it prints into answer.txt.",
                    {script: f"print({word!r} + str({a} * 7))\n"},
                    [f"python3 {script}", f"echo {printed} > answer.txt"],
                    "answer.txt",
                    printed,
                )

    for files in range(3, 6):
        for first in range(len(WORDS)):
            for stride in (1, 3, 5, 7):
                names = SOURCES[:files]
                words = [WORDS[(first + i * stride) % len(WORDS)] for i in range(files)]
                listed = ", ".join(names[:-1]) + f" and {names[-1]}"
                yield Chore(
                    "gather",
                    (files, first, stride),
                    f"Read {listed} and write their words, in that order, separated by "
                    "spaces, into answer.txt.",
                    {name: f"{word}\n" for name, word in zip(names, words, strict=True)},
                    [*(f"cat {name}" for name in names), f"echo {' '.join(words)} > answer.txt"],
                    "answer.txt",
                    " ".join(words),
                )


def split_chores(split: str, kinds: tuple[str, ...] = KINDS) -> list[Chore]:
    known = (*KINDS, *LONG_KINDS)
    unknown = set(kinds) - set(known)
    if unknown:
        raise ConfigError(f"unknown tool_use kinds {sorted(unknown)} (known: {', '.join(known)})")
    return [c for c in chores() if c.kind in kinds and c.held_out == (split == "eval")]


def tool_use(
    split: str,
    step: int,
    count: int,
    seed: int = 0,
    *,
    harness: str = "pi",
    settings: dict[str, Any] | None = None,
    kinds: list[str] | None = None,
    runtime: str = "bubblewrap",
    ro_binds: list[str] | None = None,
    num_samples: int = 4,
    timeout_s: float = 300.0,
    max_calls: int | None = 6,
    builder: str = "prefix_merging",
    turn_rewards: list[dict[str, Any]] | None = None,
    eval_seed: int | None = None,
) -> list[TaskRequest]:
    """``count`` tool-use tasks through ``harness`` (settings default to its compact preset:
    Pi's or Codex's).

    In bubblewrap the harness install (``ro_binds``, default the Polar harness prefix) is bound
    in read-only. The eval split is the same tasks in the same order for every call.
    ``max_calls`` is the gateway's turn limit (``agent.max_model_calls``): a chore takes three
    calls (a ``gather`` one up to seven: give it 10), and a policy that repeats a tool call ends
    there instead of at ``timeout_s``.
    ``builder`` is the trajectory builder (``per_request`` for the builder ablation: one trace
    per call instead of one per session). ``turn_rewards`` are per-turn reward hooks
    (``[{strategy: tool_errors}]``) for turn-level credit (``advantage.turn_reward_weight``).
    ``eval_seed`` picks the held-out chores in place of ``seed``: runs of several seeds that
    must be evaluated on the same chores pin it (bench/grpo_only.py).
    """
    from polar.harnesses.install import default_prefix
    from polar.harnesses.registry import create_harness, local_presets

    if harness not in local_presets() or create_harness(harness).shell_tool is None:
        raise ConfigError(f"tool_use needs a harness preset with a shell tool, not {harness!r}")
    by_kind = [split_chores(split, (kind,)) for kind in kinds or KINDS]
    if split == "eval":  # the same tasks every time, the kinds taking turns
        shuffler = random.Random(f"tool_use-eval:{seed if eval_seed is None else eval_seed}")
        for pool in by_kind:
            shuffler.shuffle(pool)
        chosen = [
            by_kind[i % len(by_kind)][i // len(by_kind) % len(by_kind[i % len(by_kind)])]
            for i in range(count)
        ]
    else:  # a kind, then a task of that kind: each kind as likely whatever its size
        rng = random.Random(f"{seed}:{split}:{step}")
        chosen = [rng.choice(rng.choice(by_kind)) for _ in range(count)]
    runtime_spec: dict[str, Any] = {"kind": runtime, "network": "gateway"}
    if binds_host_paths(runtime):
        runtime_spec["options"] = {"ro_binds": ro_binds or [str(default_prefix())]}
    if settings is None:
        settings = dict(create_harness(harness).compact_settings)
    tasks = []
    for i, chore in enumerate(chosen):
        tasks.append(
            TaskRequest.model_validate(
                {
                    "task_id": f"{split}-{seed}-{step}-{i}",
                    "instruction": chore.instruction,
                    "num_samples": num_samples,
                    "timeout_seconds": timeout_s,
                    "runtime": {**runtime_spec, "files": dict(chore.files)},
                    "agent": {
                        "harness": harness,
                        "settings": dict(settings),
                        "max_model_calls": max_calls,
                    },
                    "builder": {"strategy": builder},
                    "turn_rewards": list(turn_rewards or []),
                    "evaluator": {
                        "strategy": "test_on_output",
                        "config": {"command": chore.check, "timeout_s": 30},
                    },
                    "metadata": {
                        "kind": chore.kind,
                        "solution": list(chore.solution),
                    },
                }
            )
        )
    return tasks
