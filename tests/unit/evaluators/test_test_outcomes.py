"""Reading pytest outcomes from output, and grading them against expectations."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from polar.evaluators.test_outcomes import grade, parse_pytest_outcomes

VERBOSE_AND_SUMMARY = """
============================= test session starts ==============================
tests/test_x.py::test_a PASSED                                           [ 25%]
tests/test_x.py::test_b FAILED                                           [ 50%]
tests/test_x.py::test_p[1 2-x] PASSED                                    [ 75%]
tests/test_x.py::Test::test_c SKIPPED (no db)                            [100%]
=========================== short test summary info ============================
PASSED tests/test_x.py::test_a
FAILED tests/test_x.py::test_b - assert 1 == 2
SKIPPED [1] tests/test_x.py:9: no db
ERROR tests/test_y.py::test_fixture - RuntimeError: boom
FAILED (errors=1)
==================== 1 failed, 2 passed, 1 error in 0.12s =====================
"""


def test_reads_verbose_and_short_summary_lines():
    assert parse_pytest_outcomes(VERBOSE_AND_SUMMARY) == {
        "tests/test_x.py::test_a": "PASSED",
        "tests/test_x.py::test_b": "FAILED",
        "tests/test_x.py::test_p[1 2-x]": "PASSED",
        "tests/test_y.py::test_fixture": "ERROR",
    }


def test_xdist_prefixes_colours_and_worst_outcome_wins():
    output = (
        "[gw0] [ 50%] PASSED tests/t.py::test_a\n"
        "\x1b[32mtests/t.py::test_b PASSED\x1b[0m\n"
        "tests/t.py::test_b ERROR\n"  # a teardown error after the call passed
        "tests/t.py::test_b PASSED\n"
    )
    assert parse_pytest_outcomes(output) == {
        "tests/t.py::test_a": "PASSED",
        "tests/t.py::test_b": "ERROR",
    }


def test_grade_counts_missing_tests_and_errors_as_failures():
    outcomes = {"t::a": "PASSED", "t::b": "ERROR", "t::c": "SKIPPED"}
    result = grade(
        outcomes, {"t::a": "PASSED", "t::b": "FAILED", "t::c": "PASSED", "t::d": "PASSED"}
    )
    assert result.matched == ["t::a", "t::b"]
    assert result.mismatched == {
        "t::c": {"expected": "PASSED", "observed": "SKIPPED"},
        "t::d": {"expected": "PASSED", "observed": "MISSING"},
    }
    assert result.total == 4 and not result.all_matched


segment = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=8)
test_id = st.builds(
    lambda path, names, param: f"tests/{path}.py::{'::'.join(names)}{param}",
    segment,
    st.lists(segment, min_size=1, max_size=3),
    st.sampled_from(["", "[1]", "[a-b]", "[x y]"]),
)
status = st.sampled_from(["PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS"])


@given(
    st.dictionaries(test_id, status, max_size=12),
    st.lists(st.sampled_from(["verbose", "summary", "xdist"]), min_size=12, max_size=12),
    st.lists(st.sampled_from(["", "hello from a test", "FAILED (failures=2)"]), max_size=5),
)
def test_every_rendering_parses_back(expected, shapes, noise):
    lines = list(noise)
    for (name, outcome), shape in zip(expected.items(), shapes, strict=False):
        if shape == "verbose":
            lines.append(f"{name} {outcome}{' ' * 5}[ 42%]")
        elif shape == "summary":
            lines.append(
                f"{outcome} {name}" + (" - AssertionError: x - y" if outcome == "FAILED" else "")
            )
        else:
            lines.append(f"[gw3] [ 42%] {outcome} {name}")
    assert parse_pytest_outcomes("\n".join(lines)) == expected
