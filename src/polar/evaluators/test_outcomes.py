"""Read per-test outcomes out of a test runner's output, and compare them to expectations.

pytest prints an outcome per test in two shapes this module reads:

- verbose (``-v``): ``tests/test_x.py::test_a PASSED   [ 50%]`` (under xdist prefixed by
  ``[gw0] [ 50%]`` and the status first);
- the short summary (``-rA``): ``PASSED tests/test_x.py::test_a`` and
  ``FAILED tests/test_x.py::test_b - assert 1 == 2``.

Only names with ``::`` count, so prose such as ``FAILED (errors=1)`` is never a test. A test
seen several times keeps its worst outcome (a PASSED call with an ERROR teardown is an ERROR).
``-rA`` is the most robust choice: its summary lines are not interleaved with captured output.
Other runners (unittest, Go, Jest) need their own parser beside this one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

_STATUSES = "PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_XDIST = re.compile(r"^\[gw\d+\]\s+(?:\[\s*\d+%\]\s+)?")
_VERBOSE = re.compile(rf"^(?P<name>\S+?::.*?)\s+(?P<status>{_STATUSES})(?:\s+\[\s*\d+%\])?$")
_SUMMARY = re.compile(rf"^(?P<status>{_STATUSES})\s+(?P<name>\S+?::.*?)(?:\s+-\s.*)?$")
_RANK = {"PASSED": 0, "SKIPPED": 1, "XFAIL": 1, "XPASS": 1, "FAILED": 2, "ERROR": 2}
# What an expected outcome accepts: an error is a failure too.
_ACCEPTS = {"PASSED": {"PASSED"}, "FAILED": {"FAILED", "ERROR"}}


def parse_pytest_outcomes(output: str) -> dict[str, str]:
    """Test id -> PASSED, FAILED, ERROR, SKIPPED, XFAIL or XPASS."""
    outcomes: dict[str, str] = {}
    for raw in output.splitlines():
        line = _XDIST.sub("", _ANSI.sub("", raw).strip())
        match = _VERBOSE.match(line) or _SUMMARY.match(line)
        if match is None:
            continue
        name, status = match["name"].strip(), match["status"]
        if name not in outcomes or _RANK[status] >= _RANK[outcomes[name]]:
            outcomes[name] = status
    return outcomes


@dataclass(frozen=True)
class Grade:
    matched: list[str] = field(default_factory=list)
    mismatched: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.matched) + len(self.mismatched)

    @property
    def all_matched(self) -> bool:
        return not self.mismatched


def grade(outcomes: Mapping[str, str], expected: Mapping[str, str]) -> Grade:
    """Compare observed outcomes to ``expected`` (PASSED/FAILED); a test not run is MISSING."""
    result = Grade()
    for name, want in expected.items():
        seen = outcomes.get(name, "MISSING")
        if seen in _ACCEPTS[want]:
            result.matched.append(name)
        else:
            result.mismatched[name] = {"expected": want, "observed": seen}
    return result
