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

from polar.harnesses.install import default_prefix, installed_names

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted(p for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_"))


def _missing(name: str) -> str | None:
    """Why ``name``'s smoke run cannot run on this machine (None: it can)."""
    bwrap = None if shutil.which("bwrap") else "bubblewrap (bwrap) is not installed"
    installed = installed_names(default_prefix())
    pi = None if "pi" in installed else "the Pi CLI is not installed"
    codex = None if "codex" in installed else "the Codex CLI is not installed"
    ray = None if importlib.util.find_spec("ray") else "ray is not installed"
    needs = {
        "ray_nodes": [ray, bwrap],  # a real local Ray cluster, shell sessions in bubblewrap
        "swe_workspaces": [bwrap],
        "tool_use": [pi, bwrap],  # the tool_use recipe runs real Pi in bubblewrap
        "turn_credit": [pi, bwrap],  # the tool_use recipe, twice from one warm start
        "builder_ablation": [pi, bwrap],  # gather chores through Pi, both builders
        "grpo_only": [pi, codex, bwrap],  # a warm start through Pi, GRPO through Codex
        "quickstart": [pi],  # bubblewrap when present, else the local runtime
    }
    return next((why for why in needs.get(name, []) if why), None)


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
    assert {"gateway_overhead", "capture_cost", "builders", "rollout"} <= names


@pytest.mark.parametrize("bench", BENCHES, ids=lambda p: p.stem)
def test_every_bench_has_a_smoke_mode(bench: Path) -> None:
    assert _declares_smoke(bench), f"{bench.name} has no --smoke mode (CI runs every bench's)"


@pytest.mark.slow
@pytest.mark.parametrize("bench", BENCHES, ids=lambda p: p.stem)
def test_every_bench_runs_in_its_smoke_mode(bench: Path, tmp_path: Path) -> None:
    why = _missing(bench.stem)
    if why:
        pytest.skip(f"{bench.name} --smoke: {why}")
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
