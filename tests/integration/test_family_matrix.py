"""Every registered model family through real CLIs over three wire APIs (issue 27, "Done when").

For each family in the registry (new ones are picked up by registering them) and each of pi
(Chat Completions), codex (Responses) and claude (Anthropic Messages): a gateway rendering
prompts itself, in front of a scripted engine that is a model of that family (its tokenizer,
its published template, its call format sampled non-canonically: reversed key order,
pretty-printed JSON, reasoning, split tokenizations; family_kit.py), runs a two-turn tool
session. Required: the family is detected from the tokenizer; the probe completes (the parser
turned the sampled call into the CLI's tool call and the shell command ran); every capture is
the engine's own prompt and sampled ids; the merged trace's context of the second call is
exactly what the engine was sent; every prompt rendered whole is token-identical to the
family's rendering after vLLM's chat preprocessing.

A family with no test tokenizer recipe or no sampler for its call format is skipped, naming
what is missing in family_kit.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.engines.scripted import Script, ScriptedReply, logged_tokens
from polar.rendering.families.registry import DETECTION_ORDER, detect_family, get_family
from polar.schemas.flags import FLAG_RENDERED_WHOLE

from .family_kit import FamilyBackend, ServedGateway, family_tokenizer
from .harness_kit import FINAL, assert_two_turn_run, harness_prefix, run_cli, shell_call

__all__ = ["harness_prefix"]

pytestmark = pytest.mark.slow

LARGE_CONTEXT = 131072
CLIS = {"pi": "bash", "codex": "exec_command", "claude_code": "Bash"}


@pytest.fixture(scope="module", params=DETECTION_ORDER)
def family_gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServedGateway]:
    name = str(request.param)
    tokenizer = family_tokenizer(name)
    detected = detect_family(tokenizer)
    assert detected is not None and detected.name == name, detected
    backend = FamilyBackend(
        get_family(name), tokenizer, script=Script(), max_model_len=LARGE_CONTEXT
    )
    with ServedGateway(backend, tmp_path_factory.mktemp(name) / "captures.db") as gateway:
        yield gateway


@pytest.mark.parametrize("cli", list(CLIS))
async def test_family_through_a_real_cli(
    family_gateway: ServedGateway, tmp_path: Path, harness_prefix: Path, cli: str
) -> None:
    backend = family_gateway.backend
    assert isinstance(backend, FamilyBackend)
    assert await family_gateway.family() == backend.family.name
    log_start = len(backend.log)
    replies = [
        ScriptedReply(tool_calls=[shell_call(cli)], reasoning="First I write the file."),
        ScriptedReply(content=FINAL, reasoning="The command said wrote-proof."),
    ]
    run = await run_cli(family_gateway, tmp_path, harness_prefix, cli, replies)
    assert len(run.records) == 2, [r.response for r in run.records]
    first, second = run.records
    # The second call was spliced onto the first's sampled ids, so its context is exact.
    assert "prompt_extends_sampled_turn" in second.flags, second.flags
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.sampled_ids)] == (
        first.prompt_ids + first.sampled_ids
    )
    assert_two_turn_run(run, backend.tokenizer, CLIS[cli])

    # Every capture is what the engine itself reported, one for one.
    answered = [logged_tokens(reply) for reply in backend.log[log_start:]]
    assert [(r.prompt_ids, r.sampled_ids, r.logprobs) for r in run.records] == [
        (p, s, lp) for p, s, lp in answered
    ]
    # Every prompt rendered whole is the family's rendering after vLLM's preprocessing.
    whole = [r for r in run.records if any(f.startswith(FLAG_RENDERED_WHOLE) for f in r.flags)]
    assert whole, [r.flags for r in run.records]
    for record in whole:
        upstream: dict[str, Any] = record.upstream_request
        variables = upstream.get("chat_template_kwargs")  # e.g. Claude Code's effort: gpt-oss
        assert record.prompt_ids == backend.prompt_ids(
            upstream["messages"], upstream["tools"], variables=variables
        )
    # Reasoning came back in the API's own field, never inside the answer.
    if backend.thinks:
        assert "The command said wrote-proof." in str(second.response.get("reasoning")), second
