"""The bundled task set is real: each bug fails its FAIL_TO_PASS tests, the gold patch fixes
them, and the PASS_TO_PASS tests pass throughout (run for real, with the host's pytest)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from polar.swe.bundled import bundle_head, bundle_repos, bundled_instances
from polar.swe.instances import SWEInstance

pytest.importorskip("swebench")
from swebench.harness.log_parsers import PARSER_REGISTRY

INSTANCES = bundled_instances()


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return bundle_repos(tmp_path_factory.mktemp("bundles"))


def test_the_set_has_three_instances_of_distinct_repos() -> None:
    assert [i.instance_id for i in INSTANCES] == [
        "polar-bundled__ledger-1",
        "polar-bundled__shopcart-1",
        "polar-bundled__textkit-1",
    ]
    assert len({i.repo for i in INSTANCES}) == 3
    for instance in INSTANCES:
        assert instance.variant == "polar-bundled"
        assert instance.problem_statement.strip()
        assert len(instance.FAIL_TO_PASS) == 2 and len(instance.PASS_TO_PASS) == 4
        assert instance.log_parser in PARSER_REGISTRY


def test_each_bundle_holds_its_base_commit(bundles: dict[str, Path], tmp_path: Path) -> None:
    assert set(bundles) == {i.repo for i in INSTANCES}
    for instance in INSTANCES:
        assert bundle_head(bundles[instance.repo]) == instance.base_commit
    again = bundle_repos(tmp_path)  # a second machine builds the same commits
    assert {repo: bundle_head(path) for repo, path in again.items()} == {
        i.repo: i.base_commit for i in INSTANCES
    }


def test_a_bundle_at_the_right_commit_is_kept(bundles: dict[str, Path]) -> None:
    before = {repo: path.stat().st_mtime_ns for repo, path in bundles.items()}
    assert bundle_repos(next(iter(bundles.values())).parent) == bundles
    assert {repo: path.stat().st_mtime_ns for repo, path in bundles.items()} == before


def test_the_gold_patch_touches_only_source_and_the_test_patch_only_tests() -> None:
    for instance in INSTANCES:
        assert _files(instance.patch) and not any(
            f.startswith("tests/") for f in _files(instance.patch)
        )
        assert _files(instance.test_patch) and all(
            f.startswith("tests/") for f in _files(instance.test_patch)
        )
        graded = {t.split("::")[0] for t in instance.FAIL_TO_PASS + instance.PASS_TO_PASS}
        assert graded <= set(_files(instance.test_patch))


@pytest.mark.parametrize("instance", INSTANCES, ids=lambda i: i.instance_id)
def test_fail_to_pass_fails_before_and_everything_passes_after_the_gold_patch(
    instance: SWEInstance, bundles: dict[str, Path], tmp_path: Path
) -> None:
    checkout = tmp_path / "repo"
    _git(tmp_path, "clone", "--quiet", str(bundles[instance.repo]), str(checkout))
    _git(checkout, "checkout", "--quiet", "--detach", instance.base_commit or "HEAD")
    _apply(checkout, instance.test_patch)
    before = _test_status(checkout, instance)
    assert all(before.get(t) == "FAILED" for t in instance.FAIL_TO_PASS), before
    assert all(before.get(t) == "PASSED" for t in instance.PASS_TO_PASS), before

    _apply(checkout, instance.patch)
    after = _test_status(checkout, instance)
    assert all(after.get(t) == "PASSED" for t in instance.FAIL_TO_PASS + instance.PASS_TO_PASS), (
        after
    )
    assert _git(checkout, "status", "--porcelain").splitlines() == [
        f" M {f}" for f in sorted(_files(instance.patch) + _files(instance.test_patch))
    ]  # test runs leave nothing untracked behind (.gitignore)


def _files(patch: str) -> list[str]:
    return [
        line.split(" b/", 1)[1] for line in patch.splitlines() if line.startswith("diff --git ")
    ]


def _apply(checkout: Path, patch: str) -> None:
    subprocess.run(["git", "apply", "-"], cwd=checkout, input=patch, text=True, check=True)


def _test_status(checkout: Path, instance: SWEInstance) -> dict[str, str]:
    files = sorted({t.split("::")[0] for t in instance.FAIL_TO_PASS + instance.PASS_TO_PASS})
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *files],
        cwd=checkout,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},  # 0.3 s a run, not 2 s
        timeout=120,
    )
    parse = PARSER_REGISTRY[instance.log_parser or "parse_log_pytest"]
    return parse(run.stdout, None)


def _git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env |= {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    ).stdout
