"""swe_tests: SWE-bench grading of a real git repository in fresh local runtimes."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from polar import extras
from polar.errors import ConfigError
from polar.evaluators.base import EvaluationContext, EvaluationResult
from polar.evaluators.registry import create_evaluator
from polar.evaluators.swe_tests import read_log
from polar.evaluators.swebench_rules import default_eval_type, repo_parser
from polar.evaluators.test_patch import (
    DEFAULT_TEST_CMD,
    default_test_cmd,
    graded_files,
    patch_files,
)
from polar.runtimes.base import Runtime
from polar.runtimes.registry import create_runtime
from polar.runtimes.snapshot import HostSnapshot
from polar.schemas.task import EvaluatorSpec, RuntimeSpec, TaskRequest
from polar.schemas.trajectory import Trace, Trajectory, TrajectoryStatus

pytestmark = [
    pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed"),
    pytest.mark.skipif(not extras.installed("swe"), reason="the swe extra is not installed"),
]

GATEWAY = "http://127.0.0.1:9/gw"
BUGGY = (
    "def add(a, b):\n    return a - b\n\n\n"
    "def sub(a, b):\n    return a - b\n\n\n"
    "def neg(x):\n    return -x\n"
)
GOLD = BUGGY.replace("return a - b\n\n\ndef sub", "return a + b\n\n\ndef sub")
BASE_TESTS = (
    "from calc import add, neg, sub\n\n\n"
    "def test_sub():\n    assert sub(5, 3) == 2\n\n\n"
    "def test_neg():\n    assert neg(2) == -2\n"
)
NEW_TESTS = (
    "\n\ndef test_add_small():\n    assert add(2, 3) == 5\n\n\n"
    "def test_add_big():\n    assert add(1000, 1) == 1001\n"
)
T = "tests/test_calc.py::"
F2P = [T + "test_add_small", T + "test_add_big"]
P2P = [T + "test_sub", T + "test_neg"]
# The code under test runs in the test process; a conftest hook could force every outcome.
FORCE_PASS_CONFTEST = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
)


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout


def make_repo(root: Path) -> tuple[str, str]:
    """A repository with a bug at its HEAD; the test patch that adds the failing tests."""
    root.mkdir()
    (root / "tests").mkdir()
    (root / "calc.py").write_text(BUGGY)
    (root / "tests" / "test_calc.py").write_text(BASE_TESTS)
    (root / "README.md").write_text("calc\n")
    (root / ".gitignore").write_text("build/\n*.egg-info\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    (root / "tests" / "test_calc.py").write_text(BASE_TESTS + NEW_TESTS)
    test_patch = git(root, "diff")
    git(root, "checkout", "-q", "--", "tests/test_calc.py")
    return git(root, "rev-parse", "HEAD").strip(), test_patch


class Task:
    """A SWE-style task: the repo seeded into an agent runtime, fresh ones for grading."""

    def __init__(self, tmp_path: Path, kind: str = "local") -> None:
        self.tmp_path = tmp_path
        self.repo = tmp_path / "repo"
        self.commit, self.test_patch = make_repo(self.repo)
        self.spec = RuntimeSpec(
            kind=kind, source={"kind": "git", "repo": str(self.repo), "commit": self.commit}
        )
        self.runtime = create_runtime(self.spec, tmp_path / "session", GATEWAY)
        self.fresh_dirs = itertools.count()
        self.fresh_started: list[Runtime] = []

    @property
    def workspace(self) -> Path:
        return self.runtime.workspace_path

    def write(self, rel: str, text: str) -> None:
        path = self.workspace / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def fresh(self) -> Runtime:
        runtime = create_runtime(
            self.spec, self.tmp_path / f"fresh-{next(self.fresh_dirs)}", GATEWAY
        )
        self.fresh_started.append(runtime)
        return runtime

    def evaluator_spec(self, **config: object) -> EvaluatorSpec:
        config = {
            "instance_id": "acme__calc-1",
            "repo": "acme/calc",
            "FAIL_TO_PASS": F2P,
            "PASS_TO_PASS": P2P,
            "test_patch": self.test_patch,
            **config,
        }
        env = {
            # python3 is this interpreter (with pytest); no plugin of the host's interferes
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        }
        return EvaluatorSpec(strategy="swe_tests", config=config, refresh_runtime=True, env=env)

    async def grade(self, **config: object) -> EvaluationResult:
        spec = self.evaluator_spec(**config)
        task = TaskRequest(task_id="t", instruction="fix add", runtime=self.spec, evaluator=spec)
        ctx = EvaluationContext(
            runtime=self.runtime,
            trajectory=Trajectory(
                status=TrajectoryStatus.COMPLETED,
                traces=[Trace(prompt_ids=[1], response_ids=[2], loss_mask=[1])],
            ),
            task=task,
            workspace=HostSnapshot(self.workspace),
            fresh_runtime=self.fresh,
        )
        result = await create_evaluator(spec).evaluate(ctx)
        assert all(not rt.running for rt in self.fresh_started)  # stopped after grading
        return result


@pytest.fixture
async def task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("POLAR_CHECKOUT_CACHE", str(tmp_path / "checkouts"))
    fixture = Task(tmp_path)
    await fixture.runtime.start()
    yield fixture
    await fixture.runtime.stop()


# -- grading ---------------------------------------------------------------------------------


async def test_the_gold_fix_resolves_and_its_patch_is_recorded(task: Task):
    task.write("calc.py", GOLD)
    result = await task.grade()
    assert result.reward == 1.0 and result.passed is True
    details = result.details
    assert details["resolved"] is True and details["resolution"] == "RESOLVED_FULL"
    assert details["fail_to_pass"] == {"success": F2P, "failure": []}
    assert details["pass_to_pass"] == {"success": P2P, "failure": []}
    assert details["test_patch_applied"] is True and details["applied"] == ["calc.py"]
    assert details["test_cmd"] == f"{DEFAULT_TEST_CMD} tests/test_calc.py"
    assert details["log_parser"] == "parse_log_pytest" and details["eval_type"] == "pass_and_fail"
    assert details["test_exit_code"] == 0 and len(details["runs"]) == 1
    assert "4 passed" in details["test_output_tail"]
    assert details["model_patch"].startswith("diff --git a/calc.py b/calc.py\n")
    assert "-    return a - b\n+    return a + b\n" in details["model_patch"]
    assert details["model_patch_truncated"] is False
    # the recorded patch applies to the base commit and is the gold fix
    subprocess.run(
        ["git", "apply", "-"], cwd=task.repo, input=details["model_patch"], text=True, check=True
    )
    assert (task.repo / "calc.py").read_text() == GOLD


async def test_what_git_ignores_is_neither_applied_nor_recorded(task: Task):
    task.write("calc.py", GOLD)
    task.write("build/lib/calc.py", BUGGY)
    task.write("calc.egg-info/PKG-INFO", "Name: calc\n")
    result = await task.grade()
    assert result.passed is True and result.details["applied"] == ["calc.py"]
    assert result.details["gitignored"] == ["build/lib/calc.py", "calc.egg-info/PKG-INFO"]
    assert "build/" not in result.details["model_patch"]
    assert not (task.tmp_path / "fresh-0" / "workspace" / "build").exists()


async def test_no_change_is_not_resolved(task: Task):
    result = await task.grade()
    assert result.reward == 0.0 and result.passed is False
    assert result.details["resolution"] == "RESOLVED_NO" and result.details["runs"] == []
    assert result.details["fail_to_pass"] == {"success": [], "failure": F2P}
    assert result.details["model_patch"] == ""
    assert "changed no file" in result.details["reason"]


async def test_a_fix_that_breaks_a_pass_to_pass_test_is_not_resolved(task: Task):
    task.write("calc.py", GOLD.replace("return -x", "return x"))
    result = await task.grade()
    assert result.reward == 0.0 and result.details["resolution"] == "RESOLVED_NO"
    assert result.details["fail_to_pass"]["failure"] == []
    assert result.details["pass_to_pass"] == {
        "success": [T + "test_sub"],
        "failure": [T + "test_neg"],
    }
    assert result.details["reason"] is None  # an ordinary failing test, a usable log
    fraction = await task.grade(reward="fraction")
    assert fraction.reward == 0.75 and fraction.passed is False


async def test_fixing_one_of_two_failing_tests_is_partial(task: Task):
    task.write(
        "calc.py",
        BUGGY.replace("return a - b\n\n\ndef sub", "return a + b if a < 100 else 0\n\n\ndef sub"),
    )
    result = await task.grade()
    assert result.details["resolution"] == "RESOLVED_PARTIAL"
    assert result.reward == 0.0 and result.passed is False
    assert result.details["fail_to_pass"] == {"success": [F2P[0]], "failure": [F2P[1]]}
    assert (await task.grade(reward="fraction")).reward == 0.75


# -- the model cannot edit the tests that grade it -------------------------------------------


async def test_editing_the_graded_tests_is_discarded(task: Task):
    task.write(
        "tests/test_calc.py",
        BASE_TESTS + "\n\ndef test_add_small():\n    pass\n\n\ndef test_add_big():\n    pass\n",
    )
    task.write("tests/test_extra.py", "def test_x():\n    pass\n")
    task.write("notes.md", "added tests\n")
    result = await task.grade()
    assert result.passed is False and result.details["resolution"] == "RESOLVED_NO"
    assert result.details["protected_changes_discarded"] == [
        "tests/test_calc.py",
        "tests/test_extra.py",
    ]
    assert result.details["applied"] == ["notes.md"]
    assert result.details["test_patch_applied"] is True  # over the clean file
    assert result.details["fail_to_pass"]["failure"] == F2P
    assert "test_calc.py" not in result.details["model_patch"]


def fooled_in_place(task: Task) -> bool:
    """Whether the agent's trick makes every test pass where it worked."""
    apply = ["git", "apply", "-"]
    subprocess.run(apply, cwd=task.workspace, input=task.test_patch, text=True, check=True)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "tests"],
            cwd=task.workspace,
            capture_output=True,
            text=True,
        )
    finally:
        subprocess.run(
            [*apply, "-R"], cwd=task.workspace, input=task.test_patch, text=True, check=True
        )
    return "4 passed" in done.stdout and "failed" not in done.stdout


async def test_a_conftest_forcing_passes_is_discarded(task: Task):
    task.write("conftest.py", FORCE_PASS_CONFTEST)
    task.write("pkg/conftest.py", FORCE_PASS_CONFTEST)
    task.write("pytest.ini", "[pytest]\naddopts = -p calc\n")
    task.write("calc.py", BUGGY + "\n# looked into it\n")
    assert fooled_in_place(task)
    result = await task.grade()
    assert result.passed is False and result.details["fail_to_pass"]["failure"] == F2P
    assert result.details["protected_changes_discarded"] == [
        "conftest.py",
        "pkg/conftest.py",
        "pytest.ini",
    ]


async def test_a_plugin_loaded_from_setup_cfg_is_discarded_but_metadata_edits_apply(task: Task):
    plugin = FORCE_PASS_CONFTEST.replace("import pytest", "import pytest  # a plugin module")
    task.write("calc_plugin.py", plugin)
    task.write("setup.cfg", "[metadata]\nname = calc\n\n[tool:pytest]\naddopts = -p calc_plugin\n")
    assert fooled_in_place(task)
    result = await task.grade()
    assert result.passed is False and result.details["fail_to_pass"]["failure"] == F2P
    assert result.details["protected_changes_discarded"] == ["setup.cfg"]
    assert result.details["applied"] == ["calc_plugin.py"]
    task.write("setup.cfg", "[metadata]\nname = calc\n")
    task.write("calc.py", GOLD)
    fixed = await task.grade()
    assert fixed.passed is True and fixed.details["applied"] == [
        "calc.py",
        "calc_plugin.py",
        "setup.cfg",
    ]


async def test_fake_passed_lines_from_the_code_under_test_make_the_log_unusable(task: Task):
    # printed after pytest's summary, they would override its FAILED lines in the parser
    liar = (
        "import atexit, os\n"
        "atexit.register(lambda: os.write(1, b'PASSED tests/test_calc.py::test_add_small\\n'"
        " b'PASSED tests/test_calc.py::test_add_big\\n'))\n"
    )
    task.write("calc.py", liar + BUGGY)
    result = await task.grade()
    assert result.passed is False and result.details["test_exit_code"] == 1
    assert "reports no failing test" in result.details["reason"]
    assert result.details["fail_to_pass"]["failure"] == F2P


# -- what goes wrong -------------------------------------------------------------------------


async def test_a_test_patch_that_does_not_apply_is_not_resolved(task: Task):
    task.write("calc.py", GOLD)
    broken = task.test_patch.replace(" def test_neg():", " def test_negative():")
    result = await task.grade(test_patch=broken)
    assert result.passed is False and result.reward == 0.0
    assert result.details["test_patch_applied"] is False and result.details["runs"] == []
    assert result.details["reason"].startswith("the test patch did not apply: ")
    assert "tests/test_calc.py" in result.details["reason"]


async def test_a_test_command_past_its_time_limit_is_not_resolved(task: Task):
    task.write("calc.py", GOLD)
    result = await task.grade(
        test_cmd="echo 'PASSED tests/test_calc.py::test_sub'; sleep 30", timeout_s=1
    )
    assert result.passed is False and result.details["timed_out"] is True
    assert "timed out" in result.details["reason"]
    assert result.details["runs"][0]["timed_out"] is True


async def test_retries_let_a_flaky_test_pass(task: Task):
    counter = task.tmp_path / "runs-counted"
    flaky_patch = task.test_patch + (
        "diff --git a/tests/test_flaky.py b/tests/test_flaky.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/tests/test_flaky.py\n@@ -0,0 +1,7 @@\n"
        "+from pathlib import Path\n+\n+\n+def test_flaky():\n"
        f"+    counter = Path({str(counter)!r})\n"
        "+    counter.write_text(counter.read_text() + 'x' if counter.exists() else 'x')\n"
        "+    assert counter.read_text() != 'x'  # fails on the first run only\n"
    )
    flaky = "tests/test_flaky.py::test_flaky"
    task.write("calc.py", GOLD)
    once = await task.grade(test_patch=flaky_patch, PASS_TO_PASS=[*P2P, flaky])
    assert once.passed is False and once.details["pass_to_pass"]["failure"] == [flaky]
    assert once.details["test_cmd"].endswith("tests/test_calc.py tests/test_flaky.py")
    counter.unlink()
    retried = await task.grade(test_patch=flaky_patch, PASS_TO_PASS=[*P2P, flaky], retries=1)
    assert retried.passed is True and retried.details["resolution"] == "RESOLVED_FULL"
    assert retried.details["flaky"] == [flaky]
    assert [run["failing"] for run in retried.details["runs"]] == [[flaky], []]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")
async def test_grading_in_a_bubblewrap_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("POLAR_CHECKOUT_CACHE", str(tmp_path / "checkouts"))
    sandboxed = Task(tmp_path, kind="bubblewrap")
    await sandboxed.runtime.start()
    try:
        sandboxed.write("calc.py", GOLD)
        sandboxed.write("tests/test_calc.py", "")
        result = await sandboxed.grade()
    finally:
        await sandboxed.runtime.stop()
    assert result.passed is True and result.details["test_patch_applied"] is True
    assert result.details["protected_changes_discarded"] == ["tests/test_calc.py"]
    assert "-    return a - b\n+    return a + b\n" in result.details["model_patch"]


async def test_the_log_is_read_whole_past_the_exec_output_cap(task: Task):
    task.spec = task.spec.model_copy(update={"options": {"output_limit_bytes": 4096}})
    noise = 'for i in $(seq 3000); do echo "noise line $i"; done'
    verdict = "echo 'test_add (calc.tests.AddTests) ... ok'"
    task.write("calc.py", GOLD)
    result = await task.grade(
        **{**DJANGO, "test_cmd": f"{noise}; {verdict}; {noise}", "PASS_TO_PASS": []},
        log_parser="parse_log_django",
    )
    assert result.passed is True, result.details["reason"]
    assert "elided" not in result.details["test_output_tail"]


def test_read_log_never_follows_links_or_blocks(tmp_path: Path):
    secret = tmp_path / "secret"
    secret.write_text("host data")
    (tmp_path / "link.log").symlink_to(secret)
    os.mkfifo(tmp_path / "fifo.log")
    assert read_log(tmp_path / "link.log") is None
    assert read_log(tmp_path / "fifo.log") is None
    assert read_log(tmp_path / "missing.log") is None
    (tmp_path / "big.log").write_text("head\n" + "x" * 100 + "\ntail")
    cut = read_log(tmp_path / "big.log", limit=20)
    assert cut is not None and cut.startswith("head\n") and cut.endswith("\ntail")
    assert "bytes elided" in cut


# -- parsers ---------------------------------------------------------------------------------

DJANGO_LOG = "printf 'test_add (calc.tests.AddTests) ... ok\\ntest_neg (calc.tests.NegTests) ... FAIL\\n'; exit 1"
DJANGO = {
    "test_cmd": DJANGO_LOG,
    "FAIL_TO_PASS": ["test_add (calc.tests.AddTests)"],
    "PASS_TO_PASS": ["test_neg (calc.tests.NegTests)"],
    "test_patch": "",
}


async def test_the_repos_log_parser_is_swebenchs(task: Task):
    task.write("calc.py", GOLD)
    result = await task.grade(repo="django/django", **DJANGO)
    assert result.details["log_parser"] == "parse_log_django"
    assert result.details["fail_to_pass"]["success"] == DJANGO["FAIL_TO_PASS"]
    assert result.details["pass_to_pass"]["failure"] == DJANGO["PASS_TO_PASS"]
    assert result.details["test_patch_applied"] is None


async def test_an_explicit_log_parser_wins(task: Task):
    task.write("calc.py", GOLD)
    result = await task.grade(log_parser="parse_log_django", **DJANGO)
    assert result.details["log_parser"] == "parse_log_django"
    assert result.details["fail_to_pass"]["success"] == DJANGO["FAIL_TO_PASS"]
    # pytest's parser would find no test in that log
    plain = await task.grade(**DJANGO)
    assert plain.details["log_parser"] == "parse_log_pytest" and plain.passed is False


def test_an_unknown_log_parser_is_a_config_error(tmp_path: Path):
    spec = EvaluatorSpec(
        strategy="swe_tests",
        config={
            "instance_id": "i",
            "repo": "r/r",
            "FAIL_TO_PASS": [],
            "PASS_TO_PASS": [],
            "log_parser": "parse_log_nope",
        },
    )
    with pytest.raises(ConfigError, match="parse_log_nope"):
        create_evaluator(spec)
    spec.config["log_parser"] = None
    spec.config["retires"] = 1
    with pytest.raises(ConfigError, match="retires"):
        create_evaluator(spec)


def test_without_swebench_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(extras, "_importable", lambda name: name != "swebench")
    spec = EvaluatorSpec(
        strategy="swe_tests",
        config={"instance_id": "i", "repo": "r/r", "FAIL_TO_PASS": [], "PASS_TO_PASS": []},
    )
    with pytest.raises(extras.MissingExtra, match=r"polar\[swe\]"):
        create_evaluator(spec)


def test_defaults_come_from_swebench_tables():
    assert repo_parser("django/django") == "parse_log_django"
    assert repo_parser("sympy/sympy") == "parse_log_sympy"
    assert repo_parser("acme/unknown") is None
    assert default_eval_type("eslint/eslint") == "fail_only"
    assert default_eval_type("django/django") == "pass_and_fail"


def test_test_files_and_commands_come_from_the_test_patch(tmp_path: Path):
    _, test_patch = make_repo(tmp_path / "r")
    patch = test_patch + (
        "diff --git a/tests/test_old.py b/tests/test_old.py\ndeleted file mode 100644\n"
        "--- a/tests/test_old.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x = 1\n"
        "diff --git a/tests/data/my file.txt b/tests/data/my file.txt\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/tests/data/my file.txt\n@@ -0,0 +1 @@\n+x\n"
    )
    files = patch_files(patch)
    assert files.touched == ["tests/test_calc.py", "tests/test_old.py", "tests/data/my file.txt"]
    assert files.kept == ["tests/test_calc.py", "tests/data/my file.txt"]
    assert default_test_cmd(patch) == f"{DEFAULT_TEST_CMD} tests/test_calc.py"
    assert default_test_cmd("") == DEFAULT_TEST_CMD
    assert graded_files([*F2P, "test_x (a.b.C)", "tests/t.py::C::test[1]"]) == [
        "tests/t.py",
        "tests/test_calc.py",
    ]


def test_test_lists_may_be_json_strings():
    spec = EvaluatorSpec(
        strategy="swe_tests",
        config={
            "instance_id": "i",
            "repo": "r/r",
            "FAIL_TO_PASS": '["a::b"]',
            "PASS_TO_PASS": "[]",
        },
    )
    evaluator = create_evaluator(spec)
    assert evaluator.config.FAIL_TO_PASS == ["a::b"]  # type: ignore[attr-defined]
