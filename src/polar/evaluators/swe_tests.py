"""Grade a SWE-bench-style task the way SWE-bench does: the instance's tests on a fresh copy.

After the session, a fresh runtime is started from the task's spec (the repository at its base
commit, as the agent got it), the agent's changes are copied onto it except protected paths,
the instance's ``test_patch`` is applied there with ``git apply``, the test command runs, its
log is read by the ``swebench`` package's parser for the repository, and FAIL_TO_PASS /
PASS_TO_PASS are graded with swebench's own grading functions: ``RESOLVED_FULL`` (every
FAIL_TO_PASS test now passes and every PASS_TO_PASS test still does), ``RESOLVED_PARTIAL`` or
``RESOLVED_NO``.

The model never edits the tests that grade it:

- its changes to protected paths are discarded: the usual test locations, every conftest,
  pytest's own config files and modules that would shadow pytest (:data:`DEFAULT_PROTECTED`),
  plus every path the test patch touches and every file a graded pytest id names, and a
  change to ``setup.cfg``, ``tox.ini`` or ``pyproject.toml`` that touches pytest's section;
- the test patch is applied over those clean files, inside the fresh runtime;
- the default pytest command runs with ``-p no:cacheprovider`` (no ``--lf`` state from the
  agent's cache); pytest's config is *not* replaced with ``-c /dev/null``, which would break
  repositories whose markers, plugins or doctest options live in ``setup.cfg``/``tox.ini``;
- a log is unusable, as in SWE-bench, when the command timed out, when it shows no test result
  and no sign a suite ran, or when it reports no failure while the command exited non-zero
  (fake ``PASSED`` lines printed by the code under test).

Code under test still runs inside the test process, as in SWE-bench itself, so an agent that
rewrites the runner from imported source code is beyond what a log-based grader can rule out.

``retries`` reruns the test command while graded tests fail; a test passing in any run counts
as passing, and the tests that needed a rerun are listed as ``flaky``.
"""

from __future__ import annotations

import asyncio
import glob
import json
import posixpath
import shlex
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from polar.errors import ConfigError
from polar.evaluators.base import EvaluationContext, EvaluationResult, Evaluator, parse_config
from polar.evaluators.patch_text import unified_patch
from polar.evaluators.pytest_config import changes_pytest_config
from polar.evaluators.swebench_rules import (
    FAIL_TO_PASS,
    FULL,
    NO,
    PASS_TO_PASS,
    Grading,
    default_eval_type,
    repo_parser,
    unusable_log,
)
from polar.evaluators.swebench_rules import (
    parsers as swebench_parsers,
)
from polar.evaluators.test_patch import default_test_cmd, graded_files, patch_files
from polar.evaluators.workspace_diff import (
    DEFAULT_IGNORE,
    WorkspaceDiff,
    apply_diff,
    diff_trees,
    matches,
)
from polar.runtimes.base import Runtime, tail_text
from polar.runtimes.safe_files import open_regular
from polar.runtimes.snapshot import WorkspaceSnapshot
from polar.schemas.task import EvaluatorSpec

DEFAULT_PROTECTED = (
    # where tests live
    "tests",
    "test",
    "testing",
    "*/tests",
    "test_*.py",
    "*/test_*.py",
    "*_test.py",
    # what changes how pytest collects, runs and reports them (the pytest sections of
    # setup.cfg, tox.ini and pyproject.toml are guarded apart: see pytest_config)
    "*conftest.py",
    "pytest.ini",
    "*/pytest.ini",
    ".pytest.ini",
    "*/.pytest.ini",
    ".pytest_cache",
    "*.egg-info",
    "*.dist-info",
    # modules that would shadow pytest or run at interpreter start
    "pytest.py",
    "_pytest",
    "sitecustomize.py",
    "usercustomize.py",
)
"""Protected path patterns unless ``protected`` is given (see workspace_diff for the syntax).
``*/test`` and ``*/testing`` are left out on purpose: ``django/test`` and ``numpy/testing``
are library code a fix may need to change."""

MODEL_PATCH_LIMIT = 64 * 1024
OUTPUT_TAIL = 8000
GIT_TIMEOUT_S = 120.0
GITIGNORED_SHOWN = 100
LOG_LIMIT = 64 * 1024 * 1024


class SWETestsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    instance_id: str
    repo: str = Field(description="owner/name, e.g. django/django: picks the default log parser.")
    version: str | None = Field(None, description="The instance's version (some parsers read it).")
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    test_patch: str = ""
    test_cmd: str | None = Field(
        None, description="Default: pytest -rA over the test files the test patch touches."
    )
    log_parser: str | None = Field(
        None, description="A swebench PARSER_REGISTRY name; default: the repo's, else pytest's."
    )
    eval_type: Literal["pass_and_fail", "fail_only"] | None = Field(
        None, description="Default: fail_only for swebench's FAIL_ONLY_REPOS, else pass_and_fail."
    )
    timeout_s: float = Field(1800.0, gt=0, description="Time limit of each test command run.")
    retries: int = Field(0, ge=0, le=10, description="Reruns while graded tests fail (flaky).")
    protected: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PROTECTED),
        description="Paths whose agent changes are discarded (the test patch's are added).",
    )
    reward: Literal["resolved", "fraction"] = "resolved"
    ignore: list[str] = Field(default_factory=lambda: list(DEFAULT_IGNORE))

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        """SWE-bench datasets store the test lists as JSON strings."""
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON list of test ids: {exc}") from exc
        return value


def read_log(path: Path, limit: int = LOG_LIMIT, *, root: Path | None = None) -> str | None:
    """A test log the command wrote, reached beneath ``root`` and never through a link in any
    component (code under test could plant one to a host file), never a FIFO or device; head
    and tail halves past ``limit`` bytes; None when there is none."""
    try:
        with open_regular(path, limit=sys.maxsize, root=root) as (log, size):
            if size <= limit:
                data = log.read(limit)
            else:
                head = log.read(limit // 2)
                log.seek(size - limit // 2)
                data = head + f"\n[... {size - limit} bytes elided ...]\n".encode()
                data += log.read(limit // 2)
    except OSError:
        return None
    return data.decode("utf-8", "replace")


async def _read_inside(runtime: Runtime, path: str) -> str | None:
    """The log the test command wrote at ``path`` inside: read in place where the runtime's
    files are on this host, else downloaded first (a sandbox that lives elsewhere)."""
    if runtime.host_files:
        try:
            host, root = runtime.host_path(path), runtime.host_root(path)
        except ValueError:  # a link out of the runtime's home
            return None
        return await asyncio.to_thread(partial(read_log, host, root=root))
    with tempfile.TemporaryDirectory(prefix="polar-swe-log-") as tmp:
        local = Path(tmp) / "test.log"
        try:
            await runtime.download(path, local)
        except (OSError, ValueError):  # none written, or no regular file
            return None
        return await asyncio.to_thread(partial(read_log, local, root=Path(tmp)))


# -- the evaluator ---------------------------------------------------------------------------


class SWETests(Evaluator):
    """SWE-bench grading in a fresh runtime; see the module docstring."""

    name = "swe_tests"

    def __init__(self, spec: EvaluatorSpec) -> None:
        super().__init__(spec)
        self.config = parse_config(SWETestsConfig, spec)
        cfg = self.config
        parsers = swebench_parsers()
        self.log_parser = cfg.log_parser or repo_parser(cfg.repo) or "parse_log_pytest"
        if self.log_parser not in parsers:
            raise ConfigError(
                f"config of evaluator {spec.strategy!r}: log_parser {self.log_parser!r} is not "
                f"one of swebench's parsers ({', '.join(sorted(parsers))})"
            )
        self.parser = parsers[self.log_parser]
        self.eval_type = cfg.eval_type or default_eval_type(cfg.repo)
        self.test_cmd = cfg.test_cmd or default_test_cmd(cfg.test_patch)
        exact = [
            *(patch_files(cfg.test_patch).touched if cfg.test_patch else []),
            *graded_files([*cfg.FAIL_TO_PASS, *cfg.PASS_TO_PASS]),
        ]
        self.protected = [*cfg.protected, *(glob.escape(path) for path in exact)]

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationResult:
        fresh = ctx.fresh_runtime()
        try:
            await fresh.start()  # the pre-warmed one is started already; start() is idempotent
            return await self._grade(ctx.workspace, fresh)
        finally:
            await fresh.stop()

    async def _grade(self, agent: WorkspaceSnapshot, runtime: Runtime) -> EvaluationResult:
        cfg = self.config
        base = await runtime.workspace_snapshot()
        diff = await asyncio.to_thread(diff_trees, agent, base, cfg.ignore)
        # What git diff would leave out (build output, egg-info, caches) is no part of the patch.
        gitignored = await self._gitignored(runtime, [*diff.changed, *diff.deleted])
        diff = WorkspaceDiff(
            changed=[p for p in diff.changed if p not in gitignored],
            deleted=[p for p in diff.deleted if p not in gitignored],
        )
        config_changes = await asyncio.to_thread(
            lambda: [
                p for p in [*diff.changed, *diff.deleted] if changes_pytest_config(p, agent, base)
            ]
        )
        protected = [*self.protected, *(glob.escape(p) for p in config_changes)]
        mine = WorkspaceDiff(
            changed=[p for p in diff.changed if not matches(p, protected)],
            deleted=[p for p in diff.deleted if not matches(p, protected)],
        )
        patch, truncated = await asyncio.to_thread(
            unified_patch, mine, agent, base, MODEL_PATCH_LIMIT
        )
        applied = await asyncio.to_thread(
            apply_diff, diff, agent, runtime.workspace_writer(), protected
        )
        details: dict[str, Any] = {
            "instance_id": cfg.instance_id,
            "model_patch": patch,
            "model_patch_truncated": truncated,
            "applied": applied.applied,
            "protected_changes_discarded": applied.protected,
            "conflicts": applied.conflicts,
            "gitignored": sorted(gitignored)[:GITIGNORED_SHOWN],
            "test_cmd": self.test_cmd,
            "log_parser": self.log_parser,
            "eval_type": self.eval_type,
            "test_patch_applied": None,
            "test_exit_code": None,
            "timed_out": False,
            "runs": [],
            "flaky": [],
            "test_output_tail": "",
            "reason": None,
        }
        grading = Grading(list(cfg.FAIL_TO_PASS), list(cfg.PASS_TO_PASS))
        if not applied.applied:
            # Nothing to test: the tree is the base commit's, whose grades the instance states
            # (FAIL_TO_PASS fail, PASS_TO_PASS pass), and an empty patch never resolves.
            details["reason"] = "the agent changed no file outside the protected paths"
            grading.p2p_ok = set(grading.p2p)
            return self._result(grading, details, empty=True)
        if cfg.test_patch:
            error = await self._apply_test_patch(runtime)
            details["test_patch_applied"] = error is None
            if error is not None:
                details["reason"] = f"the test patch did not apply: {error}"
                return self._result(grading, details)
        await self._run_tests(runtime, grading, details)
        return self._result(grading, details)

    def _git_env(self, runtime: Runtime) -> dict[str, str]:
        # A workspace that is no git repository must not be taken for a subdirectory of one
        # above it (git apply would then skip every path "outside" it, silently).
        return {**self.spec.env, "GIT_CEILING_DIRECTORIES": posixpath.dirname(runtime.workdir)}

    async def _gitignored(self, runtime: Runtime, paths: list[str]) -> set[str]:
        """Which of ``paths`` the base tree's .gitignore files ignore (read before the agent's
        changes land, so a .gitignore it edited hides nothing); none without git or a repo."""
        if not paths:
            return set()
        result = await runtime.exec(
            ["git", "check-ignore", "-z", "--stdin"],
            env=self._git_env(runtime),
            stdin="\0".join(paths).encode() + b"\0",
            timeout_s=GIT_TIMEOUT_S,
        )
        if result.exit_code != 0:  # 1: none ignored; 128: no repository; 127: no git
            return set()
        return set(result.stdout.split("\0")) & set(paths)

    async def _apply_test_patch(self, runtime: Runtime) -> str | None:
        """Apply the test patch inside; None when it applied, else git's complaint."""
        result = await runtime.exec(
            ["git", "apply", "--verbose", "-"],
            env=self._git_env(runtime),
            stdin=self.config.test_patch.encode(),
            timeout_s=GIT_TIMEOUT_S,
        )
        if result.exit_code in (126, 127):
            raise ConfigError(
                "the swe_tests evaluator applies the test patch with git, which does not run in "
                f"the {runtime.name} runtime: {tail_text(result.stderr or result.stdout, 400)}"
            )
        if result.ok:
            return None
        return tail_text((result.stderr or result.stdout).strip(), 2000)

    async def _run_tests(self, runtime: Runtime, grading: Grading, details: dict[str, Any]) -> None:
        from swebench.types import TestSpec

        cfg = self.config
        spec = TestSpec(
            instance_id=cfg.instance_id,
            image="",
            eval_script_list=[],
            repo=cfg.repo,
            version=cfg.version or "",
            FAIL_TO_PASS=list(cfg.FAIL_TO_PASS),
            PASS_TO_PASS=list(cfg.PASS_TO_PASS),
            log_parser=self.log_parser,
            eval_type=self.eval_type,
        )
        for attempt in range(cfg.retries + 1):
            # One stream, in the order things were printed (pytest's summary comes last), into
            # a file in HOME, which every runtime can hand over: an exec's output is capped (head
            # and tail), and a long log's middle holds test results too.
            log_inside = posixpath.join(runtime.home, f".swe_tests-run{attempt}.log")
            command = "{\n" + self.test_cmd + "\n} > " + shlex.quote(log_inside) + " 2>&1"
            result = await runtime.exec(command, env=self.spec.env or None, timeout_s=cfg.timeout_s)
            written = await _read_inside(runtime, log_inside)
            log = (written or "") + result.stdout + result.stderr
            reason: str | None
            try:
                status_map = self.parser(log, spec)
            except Exception as exc:  # a parser tripping over an odd log grades nothing
                status_map, reason = {}, f"{self.log_parser} failed on the log: {exc!r}"
            else:
                reason = unusable_log(log, status_map, result)
            failing = grading.add(None if reason else self._report(status_map))
            details["runs"].append(
                {
                    "exit_code": result.exit_code,
                    "timed_out": result.timed_out,
                    "duration_s": round(result.duration_s, 3),
                    "unusable": reason,
                    "failing": failing,
                }
            )
            details.update(
                test_exit_code=result.exit_code,
                timed_out=result.timed_out,
                test_output_tail=tail_text(log, OUTPUT_TAIL),
                reason=reason,
            )
            if grading.complete:
                break
        details["flaky"] = grading.flaky

    def _report(self, status_map: dict[str, str]) -> dict[str, dict[str, list[str]]]:
        from swebench.harness.constants import EvalType
        from swebench.harness.grading import get_eval_tests_report

        gold = {
            FAIL_TO_PASS: list(self.config.FAIL_TO_PASS),
            PASS_TO_PASS: self.config.PASS_TO_PASS,
        }
        report: dict[str, dict[str, list[str]]] = get_eval_tests_report(
            status_map, gold, eval_type=EvalType(self.eval_type)
        )
        return report

    def _result(
        self, grading: Grading, details: dict[str, Any], empty: bool = False
    ) -> EvaluationResult:
        from swebench.harness.grading import get_resolution_status

        report = grading.report()
        resolution = NO if empty else str(get_resolution_status(report))
        resolved = resolution == FULL
        reward = grading.fraction() if self.config.reward == "fraction" else float(resolved)
        details.update(
            resolved=resolved,
            resolution=resolution,
            fail_to_pass=report[FAIL_TO_PASS],
            pass_to_pass=report[PASS_TO_PASS],
        )
        return EvaluationResult(reward=reward, passed=resolved, details=details)
