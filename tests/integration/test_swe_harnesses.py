"""The bundled SWE tasks end to end through REAL harness CLIs (Pi, Codex) in bubblewrap.

Each task runs the whole way a production one does: the rollout server dispatches it to a
gateway node, INIT checks the repository out at its base commit into the sandbox's workspace,
the real CLI works on it through the gateway against a scripted engine whose replies are shell
tool calls (each session follows its own script, keyed by its issue text), and ``swe_tests``
grades the result in a fresh sandbox with the instance's test patch. What is asserted is the
grade: the fix resolves, a fix that breaks a PASS_TO_PASS test does not, an agent that rewrites
the grading tests (and plants a conftest.py to force passes) gains nothing, and doing nothing
resolves nothing. The trajectories keep the tool calls and their real output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polar.client import RolloutClient
from polar.engines.registry import EngineConfig
from polar.engines.scripted import (
    ConversationScript,
    ScriptedBackend,
    ScriptedEngine,
    ScriptedReply,
)
from polar.schemas.task import SessionResult, TaskRequest
from polar.stack.local import LocalStack
from polar.swe.bundled import bundle_repos, bundled_instances
from polar.swe.instances import SWEInstance
from polar.swe.tasks import SWETaskOptions, instance_task

from .harness_kit import harness_prefix

__all__ = ["harness_prefix"]

pytestmark = pytest.mark.slow

LARGE_CONTEXT = 65536
MODEL = "polar-model"
DONE = ScriptedReply(content="Finished.")

# textkit's one-line fix, as an edit an agent would make with a shell tool.
FIX_TEXTKIT = (
    "python3 - <<'EOF'\n"
    "import pathlib\n"
    "p = pathlib.Path('textkit/strings.py')\n"
    "p.write_text(p.read_text().replace('text[:width] + suffix', "
    "'text[: width - len(suffix)] + suffix'))\n"
    "EOF\n"
    "git diff --stat"
)
# shopcart's fix, and then a regression in remove() that a PASS_TO_PASS test catches.
FIX_AND_BREAK_SHOPCART = (
    "sed -i 's/if quantity > BULK_QUANTITY:/if quantity >= BULK_QUANTITY:/' shopcart/cart.py && "
    "sed -i 's/            del self._lines\\[sku\\]/            pass/' shopcart/cart.py && "
    "git diff --stat"
)
FIX_SHOPCART = (
    "sed -i 's/if quantity > BULK_QUANTITY:/if quantity >= BULK_QUANTITY:/' shopcart/cart.py"
)
# No fix; instead the graded tests become trivially true and a conftest forces every test to pass.
GAME_LEDGER_TESTS = (
    "python3 - <<'EOF'\n"
    "import pathlib\n"
    "pathlib.Path('tests/test_money.py').write_text(\n"
    "    'def test_split_evenly_adds_up_to_the_total():\\n    assert True\\n'\n"
    "    'def test_split_evenly_gives_the_extra_cents_to_the_first_shares():\\n    assert True\\n'\n"
    ")\n"
    "pathlib.Path('conftest.py').write_text(\n"
    "    'import pytest\\n'\n"
    "    '@pytest.hookimpl(hookwrapper=True)\\n'\n"
    "    'def pytest_runtest_makereport(item, call):\\n'\n"
    "    '    outcome = yield\\n'\n"
    "    '    outcome.get_result().outcome = \"passed\"\\n'\n"
    ")\n"
    "EOF\n"
    "echo gamed"
)


def marker(instance: SWEInstance) -> str:
    """A line of the issue text that only this instance's conversation holds."""
    lines = [line for line in instance.problem_statement.splitlines() if len(line) > 20]
    return lines[0]


def git_apply(patch: str) -> str:
    return f"git apply <<'PATCH'\n{patch}PATCH\necho applied"


async def run_bundled(
    tmp_path: Path,
    tokenizer: Any,
    prefix: Path,
    harness: str,
    tool: tuple[str, str],
    commands: dict[str, str | None],
) -> dict[str, SessionResult]:
    """Run each bundled instance once with ``harness``; ``commands`` maps an instance id to the
    shell command its session's single tool call runs (None: the agent only answers)."""
    instances = {i.instance_id: i for i in bundled_instances()}
    tool_name, argument = tool
    rules: dict[str, list[ScriptedReply]] = {}
    for instance_id, command in commands.items():
        steps = [ScriptedReply(tool_calls=[(tool_name, {argument: command})])] if command else []
        rules[marker(instances[instance_id])] = [*steps, DONE]
    backend = ScriptedBackend(
        ConversationScript(rules, default=DONE), tokenizer=tokenizer, max_model_len=LARGE_CONTEXT
    )
    options = SWETaskOptions(
        runtime="bubblewrap",
        repos={repo: str(path) for repo, path in bundle_repos(tmp_path / "repos").items()},
        harness=harness,
        model_name=MODEL,
        ro_binds=[str(prefix)],
        timeout_s=240,
        test_timeout_s=120,
    )
    tasks: list[TaskRequest] = [instance_task(instances[i], options) for i in commands]
    stack = LocalStack(
        ScriptedEngine(backend),
        tmp_path / "run",
        engine_config=EngineConfig(kind="scripted"),
        served_model=backend.model_name,
        context_window=LARGE_CONTEXT,
        run_workers=3,
    )
    with stack, RolloutClient(stack.rollout_url, token=stack.rollout_token) as client:
        finished = client.run(tasks, timeout_s=600)
    by_task = {t.task_id: t.metadata["instance_id"] for t in tasks}
    return {by_task[r.task_id]: r for result in finished for r in result.results}


def evaluation(result: SessionResult) -> dict[str, Any]:
    assert result.status == "COMPLETED", (result.status, result.error)
    details: dict[str, Any] = result.metadata["evaluation"]
    return details


def tool_output_seen(result: SessionResult, tokenizer: Any, text: str) -> bool:
    """Whether ``text`` reached the model in the masked (tool output) part of a trace."""
    assert result.trajectory is not None
    for trace in result.trajectory.traces:
        masked = [t for t, m in zip(trace.response_ids, trace.loss_mask, strict=True) if not m]
        if text in tokenizer.decode(masked):
            return True
    return False


async def test_pi_resolves_regresses_and_cannot_game_the_tests(
    tmp_path: Path, tokenizer: Any, harness_prefix: Path
) -> None:
    results = await run_bundled(
        tmp_path,
        tokenizer,
        harness_prefix,
        "pi",
        ("bash", "command"),
        {
            "polar-bundled__textkit-1": FIX_TEXTKIT,
            "polar-bundled__shopcart-1": FIX_AND_BREAK_SHOPCART,
            "polar-bundled__ledger-1": GAME_LEDGER_TESTS,
        },
    )
    fixed = evaluation(results["polar-bundled__textkit-1"])
    assert fixed["resolved"] is True and fixed["resolution"] == "RESOLVED_FULL"
    assert results["polar-bundled__textkit-1"].reward == 1.0
    assert "text[: width - len(suffix)] + suffix" in fixed["model_patch"]
    assert fixed["applied"] == ["textkit/strings.py"]
    assert tool_output_seen(results["polar-bundled__textkit-1"], tokenizer, "strings.py")

    regressed = evaluation(results["polar-bundled__shopcart-1"])
    assert regressed["resolved"] is False and regressed["resolution"] == "RESOLVED_NO"
    assert sorted(regressed["fail_to_pass"]["failure"]) == []
    assert regressed["pass_to_pass"]["failure"] == ["tests/test_cart.py::test_remove"]
    assert results["polar-bundled__shopcart-1"].reward == 0.0

    gamed = evaluation(results["polar-bundled__ledger-1"])
    assert gamed["resolved"] is False
    assert sorted(gamed["protected_changes_discarded"]) == ["conftest.py", "tests/test_money.py"]
    assert gamed["applied"] == []
    assert len(gamed["fail_to_pass"]["failure"]) == 2
    assert results["polar-bundled__ledger-1"].reward == 0.0
    assert tool_output_seen(results["polar-bundled__ledger-1"], tokenizer, "gamed")


async def test_codex_resolves_with_git_apply_and_doing_nothing_resolves_nothing(
    tmp_path: Path, tokenizer: Any, harness_prefix: Path
) -> None:
    ledger = next(i for i in bundled_instances() if i.instance_id == "polar-bundled__ledger-1")
    results = await run_bundled(
        tmp_path,
        tokenizer,
        harness_prefix,
        "codex",
        ("exec_command", "cmd"),
        {
            "polar-bundled__ledger-1": git_apply(ledger.patch),
            "polar-bundled__shopcart-1": None,
            "polar-bundled__textkit-1": FIX_SHOPCART,  # the wrong repository's fix: a no-op
        },
    )
    applied = evaluation(results["polar-bundled__ledger-1"])
    assert applied["resolved"] is True, applied
    assert results["polar-bundled__ledger-1"].reward == 1.0
    assert tool_output_seen(results["polar-bundled__ledger-1"], tokenizer, "applied")

    for instance_id in ("polar-bundled__shopcart-1", "polar-bundled__textkit-1"):
        idle = evaluation(results[instance_id])
        assert idle["resolved"] is False and idle["model_patch"] == ""
        assert len(idle["fail_to_pass"]["failure"]) == 2
        assert idle["pass_to_pass"]["failure"] == []
        assert results[instance_id].reward == 0.0
