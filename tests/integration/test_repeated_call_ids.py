"""A model that repeats its call ids, through real CLIs (issue 36, item 2).

Kimi K2's calls carry the model's own id (``functions.NAME:IDX``), and a model that restarts
the index every turn (weak policies early in RL do) samples ``functions.Bash:0`` in each one.
The gateway keeps the model's ids for the history it renders, but a harness must never see one
id twice in a session: Claude Code drops a tool_use whose id it has seen, so the model never
sees that call's result and asks again. Against this engine (a Kimi-format model that repeats
``:0`` and runs the next command whose result its prompt lacks) Claude Code looped until its
120 s timeout: 129 calls on two shared cores (214 in the issue), every call after the second
rendered whole (``unknown_assistant_turn``); pi and codex finished but were given one id three
times. Now each of the six CLIs (and Pi on Gemini's API, which sends calls and results back
without ids) finishes in four calls, the ids it was given are unique, every prompt after the
first extends the one before it (one merged trace, every context exact), and the history the
engine was sent names each call by the model's own id, in the messages and in the prompt ids
(``## Return of functions.NAME:0``, never an id the gateway made up for an id-less call).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from polar.engines.scripted import Script, ScriptedReply, logged_tokens
from polar.harnesses.registry import CLI_PRESETS
from polar.rendering.families.registry import get_family
from polar.schemas.flags import FLAG_SPLICED
from polar.trajectory.registry import create_builder

from .family_kit import FamilyBackend, ServedGateway, family_tokenizer
from .harness_kit import FINAL, harness_prefix, run_cli, shell_call

__all__ = ["harness_prefix"]

pytestmark = pytest.mark.slow

# Each CLI on its own wire API, and Pi on Gemini's too: its Google client sends calls and
# results back without ids (by name), as google-genai users do.
RUNS: dict[str, tuple[str, dict[str, Any]]] = {name: (name, {}) for name in sorted(CLI_PRESETS)}
RUNS["pi_google"] = ("pi", {"api": "google-generative-ai"})
ID_LESS = {"pi_google"}
COMMANDS = ("echo one > one.txt", "echo two > two.txt", "echo polar > proof.txt")


class TurnScript(Script):
    """A policy that acts on the history it is shown: it runs the next command whose result
    the prompt does not hold yet (Kimi's ``## Return of`` lines), then answers; a harness that
    loses a call from its history is asked for that call again."""

    needs_conversation = True

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[ScriptedReply] = []

    def choose(self, conversation: str, turn: int) -> ScriptedReply:
        if not self.steps:
            return self.next()
        done = conversation.count("## Return of ")
        return self.steps[done] if done < len(self.steps) else ScriptedReply(content=FINAL)


@pytest.fixture(scope="module")
def kimi_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedGateway]:
    family = get_family("kimi_k2")
    backend = FamilyBackend(
        family, family_tokenizer("kimi_k2"), script=TurnScript(), max_model_len=131072
    )
    with ServedGateway(backend, tmp_path_factory.mktemp("kimi") / "captures.db") as gateway:
        yield gateway


def harness_call_ids(record: Any) -> list[str]:
    """The call ids the harness echoed in this call's request, in the provider's own shape."""
    request, found = record.request, []
    if record.provider == "anthropic":
        for message in request["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else []:
                if block.get("type") == "tool_use":
                    found.append(block["id"])
    elif record.provider == "openai_responses":
        items = request["input"] if isinstance(request["input"], list) else []
        found = [i["call_id"] for i in items if i.get("type") == "function_call"]
    elif record.provider == "google":
        for content in request["contents"]:
            for part in content.get("parts") or []:
                call = part.get("functionCall") or part.get("function_call") or {}
                found += [call["id"]] if call.get("id") else []
    else:
        for message in request["messages"]:
            found += [c["id"] for c in message.get("tool_calls") or []]
    return found


@pytest.mark.parametrize("case", list(RUNS))
async def test_repeated_model_call_ids_finish_every_cli(
    kimi_gateway: ServedGateway, tmp_path: Path, harness_prefix: Path, case: str
) -> None:
    cli, settings = RUNS[case]
    backend = kimi_gateway.backend
    log_start = len(backend.log)
    script = backend.script
    assert isinstance(script, TurnScript)
    script.steps = [ScriptedReply(tool_calls=[shell_call(cli, c)]) for c in COMMANDS]
    run = await run_cli(kimi_gateway, tmp_path, harness_prefix, cli, [], settings)
    records = [r for r in run.records if not r.tags]  # side calls (titles) aside
    assert len(records) == 4, [(r.flags, r.response) for r in run.records]
    assert run.outcome.exit_code == 0
    for name, word in (("one.txt", "one"), ("two.txt", "two"), ("proof.txt", "polar")):
        assert (run.workspace / name).read_text() == f"{word}\n"

    # The model sampled one id three times; the harness saw three different ones.
    tool = shell_call(cli)[0]
    model_ids = [c["id"] for r in records[:3] for c in r.response["tool_calls"]]
    assert model_ids == [f"functions.{tool}:0"] * 3
    seen = harness_call_ids(records[3])
    assert len(seen) == (0 if case in ID_LESS else 3) and len(set(seen)) == len(seen), seen
    # The history the engine was sent names every call by the model's own id.
    last = records[3].upstream_request["messages"]
    assert [c["id"] for m in last for c in m.get("tool_calls") or []] == model_ids
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == model_ids
    # And so do the prompt ids: every result the engine read is rendered under the model's id.
    assert isinstance(backend, FamilyBackend)
    prompt = backend.tokenizer.decode(records[3].prompt_ids)
    assert re.findall(r"## Return of (\S+)", prompt) == model_ids, prompt[-2000:]
    assert not re.search(r"\bcall_\w", prompt), "an id the gateway made up reached the prompt"

    # Every call after the first extends the one before it: one trace, every context exact.
    for before, after in pairwise(records):
        assert FLAG_SPLICED in after.flags, after.flags
        head = before.prompt_ids + before.sampled_ids
        assert after.prompt_ids[: len(head)] == head
    trajectory = create_builder("prefix_merging").build(records)
    assert len(trajectory.traces) == 1, trajectory.metadata
    answered = [logged_tokens(reply) for reply in backend.log[log_start:]]
    assert [(r.prompt_ids, r.sampled_ids) for r in run.records] == [(p, s) for p, s, _ in answered]
