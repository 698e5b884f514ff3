"""An edit to setup.cfg, tox.ini or pyproject.toml counts when it touches pytest's section."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar.evaluators.pytest_config import changes_pytest_config
from polar.runtimes.snapshot import HostSnapshot

SETUP_CFG = "[metadata]\nname = calc\n\n[tool:pytest]\nmarkers =\n    slow: slow tests\n"
PYPROJECT = '[project]\nname = "calc"\n\n[tool.pytest.ini_options]\naddopts = "-q"\n'


def edited(tmp_path: Path, rel: str, before: str | None, after: str | None) -> bool:
    agent, base = tmp_path / "agent", tmp_path / "base"
    for root, text in ((agent, after), (base, before)):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        if text is not None:
            (root / rel).write_text(text)
    return changes_pytest_config(rel, HostSnapshot(agent), HostSnapshot(base))


@pytest.mark.parametrize(
    ("rel", "before", "after", "changed"),
    [
        ("setup.cfg", SETUP_CFG, SETUP_CFG.replace("name = calc", "name = calc2"), False),
        ("setup.cfg", SETUP_CFG, SETUP_CFG + "addopts = -p calc_plugin\n", True),
        ("setup.cfg", SETUP_CFG, None, True),  # deleted with its pytest section
        ("setup.cfg", None, "[metadata]\nname = calc\n", False),  # new, no pytest section
        ("setup.cfg", None, "[tool:pytest]\naddopts = -p x\n", True),
        ("sub/setup.cfg", "[flake8]\nmax-line-length = 99\n", "[pytest]\naddopts = -p x\n", True),
        ("tox.ini", "[tox]\nenvlist = py3\n", "[tox]\nenvlist = py3,py4\n", False),
        (
            "tox.ini",
            "[tox]\nenvlist = py3\n",
            "[tox]\nenvlist = py3\n[pytest]\naddopts = -p x\n",
            True,
        ),
        ("pyproject.toml", PYPROJECT, PYPROJECT.replace('"calc"', '"calc2"'), False),
        ("pyproject.toml", PYPROJECT, PYPROJECT.replace("-q", "-p calc_plugin"), True),
        (
            "pyproject.toml",
            '[project]\nname = "c"\n',
            '[tool.pytest]\naddopts = ["-p", "x"]\n',
            True,
        ),
        ("pyproject.toml", PYPROJECT, "[tool.pytest.ini_options\n", True),  # does not parse
        ("setup.cfg", SETUP_CFG, "no section header\n", True),
        ("calc.py", "x = 1\n", "x = 2\n", False),
    ],
)
def test_only_pytest_sections_count(tmp_path: Path, rel, before, after, changed):
    assert edited(tmp_path, rel, before, after) is changed


def test_a_link_counts_as_changed_and_is_not_followed(tmp_path: Path):
    outside = tmp_path / "outside.cfg"
    outside.write_text(SETUP_CFG)
    (tmp_path / "agent").mkdir()
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "setup.cfg").write_text(SETUP_CFG)
    (tmp_path / "agent" / "setup.cfg").symlink_to(outside)
    assert (
        changes_pytest_config(
            "setup.cfg", HostSnapshot(tmp_path / "agent"), HostSnapshot(tmp_path / "base")
        )
        is True
    )
