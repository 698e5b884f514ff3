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

from polar.schemas.task import SessionResult
from polar.swe.bundled import bundle_repos, bundled_instances
from polar.swe.tasks import SWETaskOptions, instance_task

from .harness_kit import harness_prefix
from .swe_kit import (
    FIX_AND_BREAK_SHOPCART,
    FIX_SHOPCART,
    FIX_TEXTKIT,
    GAME_LEDGER_TESTS,
    MODEL,
    evaluation,
    git_apply,
    run_tasks,
    scripted_backend,
    tool_output_seen,
)

__all__ = ["harness_prefix"]

pytestmark = pytest.mark.slow


def run_bundled(
    tmp_path: Path,
    tokenizer: Any,
    prefix: Path,
    harness: str,
    tool: tuple[str, str],
    commands: dict[str, str | None],
) -> dict[str, SessionResult]:
    """Each instance of ``commands`` once, with ``harness`` in bubblewrap."""
    options = SWETaskOptions(
        runtime="bubblewrap",
        repos={repo: str(path) for repo, path in bundle_repos(tmp_path / "repos").items()},
        harness=harness,
        model_name=MODEL,
        ro_binds=[str(prefix)],
        timeout_s=240,
        test_timeout_s=120,
    )
    instances = {i.instance_id: i for i in bundled_instances()}
    tasks = [instance_task(instances[i], options) for i in commands]
    return run_tasks(tmp_path / "run", scripted_backend(tokenizer, tool, commands), tasks)


def test_pi_resolves_regresses_and_cannot_game_the_tests(
    tmp_path: Path, tokenizer: Any, harness_prefix: Path
) -> None:
    results = run_bundled(
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


def test_codex_resolves_with_git_apply_and_doing_nothing_resolves_nothing(
    tmp_path: Path, tokenizer: Any, harness_prefix: Path
) -> None:
    ledger = next(i for i in bundled_instances() if i.instance_id == "polar-bundled__ledger-1")
    results = run_bundled(
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
