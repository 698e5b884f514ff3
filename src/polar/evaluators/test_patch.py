"""What a SWE-bench test patch touches, and the test command that runs what it adds.

The files a patch touches are protected from the agent (its edits there are discarded before
grading) and the test files it leaves behind are what the default command runs.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

DEFAULT_TEST_CMD = "python3 -m pytest -rA --tb=short -p no:cacheprovider"


@dataclass(frozen=True)
class PatchFiles:
    touched: list[str]
    """Every path the patch reads or writes (both names of a rename)."""
    kept: list[str]
    """The paths that exist once it is applied."""


_DIFF_GIT = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)


def patch_files(patch: str) -> PatchFiles:
    """The files a unified diff touches, read with ``unidiff`` (a swebench dependency)."""
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    touched: dict[str, None] = {}
    kept: dict[str, None] = {}
    try:
        files = [(f.source_file, f.target_file, f.is_removed_file) for f in PatchSet(patch)]
    except UnidiffParseError:
        files = [(f"a/{a}", f"b/{b}", False) for a, b in _DIFF_GIT.findall(patch)]
    for source, target, removed in files:
        for name, prefix in ((source, "a/"), (target, "b/")):
            if name != "/dev/null":
                touched[name.removeprefix(prefix)] = None
        if not removed and target != "/dev/null":
            kept[target.removeprefix("b/")] = None
    return PatchFiles(touched=list(touched), kept=list(kept))


def looks_like_test(path: str) -> bool:
    name = PurePosixPath(path).name
    return name.endswith(".py") and (
        name.startswith("test") or name.endswith("_test.py") or name == "tests.py"
    )


def default_test_cmd(test_patch: str) -> str:
    """pytest over the test files the patch leaves behind, or the whole suite without any."""
    files = [p for p in patch_files(test_patch).kept if looks_like_test(p)] if test_patch else []
    return " ".join([DEFAULT_TEST_CMD, *(shlex.quote(p) for p in files)])


def graded_files(tests: list[str]) -> list[str]:
    """The files pytest ids name (``tests/test_x.py::test_a`` -> ``tests/test_x.py``)."""
    found = {t.split("::", 1)[0] for t in tests if "::" in t}
    return sorted(p for p in found if p.endswith(".py") and not p.startswith("/"))
