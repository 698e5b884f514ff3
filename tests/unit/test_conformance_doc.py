"""docs/conformance.md is what the tests' conformance marks say (regenerate it with
``python tests/conformance_matrix.py --write``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "conformance_matrix", Path(__file__).resolve().parents[1] / "conformance_matrix.py"
)
assert _spec is not None and _spec.loader is not None
matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(matrix)
DOC, marks, render = matrix.DOC, matrix.marks, matrix.render


def test_the_page_matches_the_tests() -> None:
    """In its own process: collecting the marked tests must not disturb this session."""
    script = Path(matrix.__file__)
    done = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    page = DOC.read_text()
    # A parametrized case's own mark counts: stream liveness marks each API's case.
    row = "| `stream_liveness` | supported | supported | supported | supported |"
    assert row in page


def test_a_cell_is_one_status_and_unknown_apis_or_statuses_are_errors() -> None:
    Mark = matrix.Mark
    found = [Mark("f", "anthropic", "mapped", "a"), Mark("f", "google", "refused", "b")]
    assert "| `f` | n/a | n/a | mapped | refused |" in render(found)
    with pytest.raises(ValueError, match="disagree"):
        render([*found, Mark("f", "anthropic", "refused", "c")])
    with pytest.raises(ValueError, match="cohere"):
        Mark("g", "cohere", "mapped", "d")
    with pytest.raises(ValueError, match="silently"):
        Mark("g", "google", "silently", "e")
