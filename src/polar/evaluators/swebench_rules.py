"""SWE-bench's own rules, from the ``swebench`` package: which log parser reads a repository's
test output, which grading mode it takes, when a log cannot be graded, and how FAIL_TO_PASS and
PASS_TO_PASS tests fold across reruns of a flaky suite.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

from polar.extras import require
from polar.runtimes.base import ExecResult

FAIL_TO_PASS = "FAIL_TO_PASS"
PASS_TO_PASS = "PASS_TO_PASS"
FULL, PARTIAL, NO = "RESOLVED_FULL", "RESOLVED_PARTIAL", "RESOLVED_NO"
_FAILING = ("FAILED", "ERROR")


def parsers() -> dict[str, Callable[..., dict[str, str]]]:
    require("swe", "the swe_tests evaluator")
    from swebench.harness.log_parsers import PARSER_REGISTRY

    return dict(PARSER_REGISTRY)


def repo_parser(repo: str) -> str | None:
    """The PARSER_REGISTRY name swebench's ``MAP_REPO_TO_PARSER_*`` tables give ``repo``."""
    registry = parsers()
    package = importlib.import_module("swebench.harness.log_parsers")
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, table in vars(module).items():
            if name.startswith("MAP_REPO_TO_PARSER") and isinstance(table, dict) and repo in table:
                return next((key for key, fn in registry.items() if fn is table[repo]), None)
    return None


def default_eval_type(repo: str) -> str:
    require("swe", "the swe_tests evaluator")
    from swebench.harness.constants import FAIL_ONLY_REPOS

    return "fail_only" if repo in FAIL_ONLY_REPOS else "pass_and_fail"


def unusable_log(log: str, status_map: dict[str, str], result: ExecResult) -> str | None:
    """Why a run's log cannot be graded (SWE-bench's rules), or None when it can."""
    from swebench.harness.grading import SUITE_RAN

    if result.timed_out:
        return f"the test command timed out after {result.duration_s:.0f}s"
    if not status_map and not SUITE_RAN.search(log):
        return "the log shows no test result"
    if result.exit_code != 0 and status_map and not any(s in _FAILING for s in status_map.values()):
        return (
            f"the test command exited with {result.exit_code} but its log reports no failing "
            "test: the log does not describe the run"
        )
    return None


@dataclass
class Grading:
    """Graded tests across runs: a test passing in any run counts as passing."""

    f2p: list[str]
    p2p: list[str]
    f2p_ok: set[str] = field(default_factory=set)
    p2p_ok: set[str] = field(default_factory=set)
    failed_once: set[str] = field(default_factory=set)

    def add(self, report: dict[str, dict[str, list[str]]] | None) -> list[str]:
        """Fold in one run's swebench report (None: an unusable log); its failing tests."""
        f2p_ok = set(report[FAIL_TO_PASS]["success"]) if report else set()
        p2p_ok = set(report[PASS_TO_PASS]["success"]) if report else set()
        failing = [t for t in self.f2p if t not in f2p_ok] + [
            t for t in self.p2p if t not in p2p_ok
        ]
        self.f2p_ok |= f2p_ok
        self.p2p_ok |= p2p_ok
        self.failed_once.update(failing)
        return failing

    @property
    def complete(self) -> bool:
        return self.f2p_ok >= set(self.f2p) and self.p2p_ok >= set(self.p2p)

    def report(self) -> dict[str, dict[str, list[str]]]:
        return {
            FAIL_TO_PASS: _split(self.f2p, self.f2p_ok),
            PASS_TO_PASS: _split(self.p2p, self.p2p_ok),
        }

    @property
    def flaky(self) -> list[str]:
        return sorted((self.f2p_ok | self.p2p_ok) & self.failed_once)

    def fraction(self) -> float:
        total = len(self.f2p) + len(self.p2p)
        ok = sum(t in self.f2p_ok for t in self.f2p) + sum(t in self.p2p_ok for t in self.p2p)
        return ok / total if total else 1.0


def _split(tests: list[str], ok: set[str]) -> dict[str, list[str]]:
    return {"success": [t for t in tests if t in ok], "failure": [t for t in tests if t not in ok]}
