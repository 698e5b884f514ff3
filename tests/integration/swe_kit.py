"""Shared by the live SWE tests: scripts that fix (or game) the bundled tasks, and a one-call
run of SWE tasks through a local stack (rollout server, gateway node, scripted engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
from polar.swe.bundled import bundled_instances
from polar.swe.instances import SWEInstance

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


def scripted_backend(
    tokenizer: Any, tool: tuple[str, str], commands: dict[str, str | None]
) -> ScriptedBackend:
    """An engine script per bundled instance: ``commands`` maps an instance id to the shell
    command its session's single tool call runs (None: the agent only answers)."""
    instances = {i.instance_id: i for i in bundled_instances()}
    tool_name, argument = tool
    rules: dict[str, list[ScriptedReply]] = {}
    for instance_id, command in commands.items():
        steps = [ScriptedReply(tool_calls=[(tool_name, {argument: command})])] if command else []
        rules[marker(instances[instance_id])] = [*steps, DONE]
    script = ConversationScript(rules, default=DONE)
    return ScriptedBackend(script, tokenizer=tokenizer, max_model_len=LARGE_CONTEXT)


def run_tasks(
    work_dir: Path, backend: ScriptedBackend, tasks: list[TaskRequest]
) -> dict[str, SessionResult]:
    """Run ``tasks`` through a local stack; each session's result by its instance id."""
    stack = LocalStack(
        ScriptedEngine(backend),
        work_dir,
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
    assert result.evaluation is not None
    return result.evaluation.details


def tool_output_seen(result: SessionResult, tokenizer: Any, text: str) -> bool:
    """Whether ``text`` reached the model in the masked (tool output) part of a trace."""
    assert result.trajectory is not None
    for trace in result.trajectory.traces:
        masked = [t for t, m in zip(trace.response_ids, trace.loss_mask, strict=True) if not m]
        if text in tokenizer.decode(masked):
            return True
    return False
