"""docs/conformance.md, generated from the tests' ``conformance`` marks so it cannot drift.

Each ``@pytest.mark.conformance(feature=..., api=..., status=...)`` (on a test, or on a
``pytest.param``) is one cell of the matrix: a feature of a provider API and what the gateway
does with it (supported, mapped or refused), proven by that test. The unit suite checks that the
document equals what the marks say; regenerate it with::

    python tests/conformance_matrix.py --write
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "conformance.md"
APIS = ("openai_chat", "openai_responses", "anthropic", "google", "google_interactions")
API_TITLES = {
    "openai_chat": "OpenAI Chat Completions",
    "openai_responses": "OpenAI Responses",
    "anthropic": "Anthropic Messages",
    "google": "Google generateContent",
    "google_interactions": "Google Interactions",
}
STATUSES = ("supported", "mapped", "refused")


class Mark:
    def __init__(self, feature: str, api: str, status: str, where: str) -> None:
        if api not in APIS:
            raise ValueError(f"{where}: conformance api {api!r} is not one of {APIS}")
        if status not in STATUSES:
            raise ValueError(f"{where}: conformance status {status!r} is not one of {STATUSES}")
        self.feature, self.api, self.status, self.where = feature, api, status, where


def marks(tests_dir: Path = ROOT / "tests") -> list[Mark]:
    """Every conformance mark of the collected tests (parametrized cases included), found by
    letting pytest collect the files that use the mark; nothing is run."""
    files = [
        str(path)
        for path in sorted(tests_dir.rglob("test_*.py"))
        if "mark.conformance" in path.read_text()
    ]
    if not files:
        return []
    collector = _Collector()
    args = ["--collect-only", "-p", "no:cacheprovider", "-p", "no:terminal", *files]
    code = pytest.main(args, plugins=[collector])
    if code not in (0, 5):
        raise RuntimeError(f"collecting the conformance tests failed (pytest exit {code})")
    return collector.marks


class _Collector:
    """A pytest plugin that keeps the conformance marks of every collected item."""

    def __init__(self) -> None:
        self.marks: list[Mark] = []

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            for mark in item.iter_markers("conformance"):
                kwargs = mark.kwargs
                self.marks.append(
                    Mark(kwargs["feature"], kwargs["api"], kwargs["status"], where=item.nodeid)
                )


def render(found: list[Mark]) -> str:
    cells: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    tests: dict[tuple[str, str], list[str]] = defaultdict(list)
    for mark in found:
        cells[mark.feature][mark.api].add(mark.status)
        tests[(mark.feature, mark.api)].append(mark.where)
    clashes = [
        f"{feature} x {api}: {sorted(statuses)}"
        for feature, row in cells.items()
        for api, statuses in row.items()
        if len(statuses) > 1
    ]
    if clashes:
        raise ValueError("tests disagree on a cell: " + "; ".join(clashes))
    lines = [
        "# Provider conformance",
        "",
        "What the gateway does with each request feature, per provider API, as proven by the",
        "official-SDK tests (generated from their `conformance` marks by",
        "`python tests/conformance_matrix.py --write`; the unit suite fails if this page is stale).",
        "",
        "- **supported**: behaves as the provider does;",
        "- **mapped**: carried out another way that the client cannot tell apart (e.g. a provider",
        "  option turned into the engine's own parameter);",
        "- **refused**: answered with the provider's own 4xx naming the feature;",
        "- **n/a**: not an option of that API.",
        "",
        "Nothing is dropped silently: every call's capture record notes what became of each",
        "feature it used (`feature <name>: honoured | mapped | refused`).",
        "",
        "A feature named with a render mode is decided per mode: under engine rendering the",
        "engine's chat endpoint gets it as its own field, under gateway rendering the gateway",
        "does it (the served template's own variables, a regex over the family's call format).",
        "A feature named without one is decided by the API's adapter before either, so it is",
        "the same in both modes. Reasoning switches and efforts are mapped to the served",
        "template's variables where it reads them (Qwen3, GLM, Nemotron: `enable_thinking`;",
        "gpt-oss: `reasoning_effort`), else recorded as applied to nothing, with a note naming the",
        "field; a thinking budget is always recorded so (no engine here takes one).",
        "",
        "| feature | " + " | ".join(API_TITLES[a] for a in APIS) + " |",
        "|---|" + "---|" * len(APIS),
    ]
    for feature in sorted(cells):
        row = cells[feature]
        lines.append(
            f"| `{feature}` | "
            + " | ".join(next(iter(row[a])) if row.get(a) else "n/a" for a in APIS)
            + " |"
        )
    lines += ["", "## The tests behind each cell", ""]
    for (feature, api), where in sorted(tests.items()):
        lines.append(f"- `{feature}` × {API_TITLES[api]}: " + ", ".join(sorted(set(where))))
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description="generate docs/conformance.md from the tests")
    parser.add_argument("--write", action="store_true", help="write the page (else print it)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args()
    text = render(marks())
    if args.check:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is stale: python tests/conformance_matrix.py --write")
            return 1
        return 0
    if args.write:
        DOC.write_text(text)
        print(f"wrote {DOC}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
