"""Every benchmark under bench/ still runs: its ``--smoke`` mode (tiny sizes, seconds of work),
as a subprocess, as a user would start it. A benchmark whose code rots fails here, and so in
CI, instead of on the day someone wants its figures again."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from polar.harnesses.install import install

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted(p for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_"))
# What each smoke run needs beyond the dev install: the agent CLIs it runs (installed here,
# from the pinned lockfile, as on a fresh clone) and what CI provides (bubblewrap, ray).
CLIS = {
    "tool_use": ["pi"],  # the tool_use recipe runs real Pi in bubblewrap
    "turn_credit": ["pi"],  # the tool_use recipe, twice from one warm start
    "builder_ablation": ["pi"],  # gather chores through Pi, both builders
    "grpo_only": ["pi", "codex"],  # a warm start through Pi, GRPO through Codex
    "quickstart": ["pi"],  # bubblewrap when present, else the local runtime
}
BUBBLEWRAP = {
    "ray_nodes",
    "swe_workspaces",
    "tool_use",
    "turn_credit",
    "builder_ablation",
    "grpo_only",
}
RAY = {"ray_nodes"}  # a real local Ray cluster, shell sessions in bubblewrap


def _provide(name: str) -> None:
    """Install the CLIs ``name``'s smoke run needs; fail, saying what is missing, where the
    machine lacks what CI provides. Nothing is skipped: CI runs every bench's smoke mode."""
    if name in BUBBLEWRAP and shutil.which("bwrap") is None:
        pytest.fail(f"{name} --smoke needs bubblewrap: apt-get install -y bubblewrap")
    if name in RAY and importlib.util.find_spec("ray") is None:
        pytest.fail(f"{name} --smoke needs ray: pip install -e '.[dev]'")
    if name in CLIS:
        install(CLIS[name], echo=lambda line: None)  # a no-op once installed


def _declares_smoke(path: Path) -> bool:
    """Whether the script's argument parser has a ``--smoke`` flag."""
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
            and any(isinstance(a, ast.Constant) and a.value == "--smoke" for a in node.args)
        ):
            return True
    return False


def test_the_bench_list_is_complete() -> None:
    names = {p.stem for p in BENCHES}
    assert {"gateway_overhead", "capture_cost", "builders", "rollout", "rollout_scale"} <= names


@pytest.mark.parametrize("bench", BENCHES, ids=lambda p: p.stem)
def test_every_bench_has_a_smoke_mode(bench: Path) -> None:
    assert _declares_smoke(bench), f"{bench.name} has no --smoke mode (CI runs every bench's)"


@pytest.mark.slow
@pytest.mark.parametrize("bench", BENCHES, ids=lambda p: p.stem)
def test_every_bench_runs_in_its_smoke_mode(bench: Path, tmp_path: Path) -> None:
    _provide(bench.stem)
    done = subprocess.run(
        [sys.executable, str(bench), "--smoke"],
        cwd=tmp_path,  # whatever a bench writes by default lands here
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, f"{bench.name} --smoke: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    assert done.stdout.strip(), f"{bench.name} --smoke printed no result"
