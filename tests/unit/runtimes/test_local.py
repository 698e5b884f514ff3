"""The shared exec machinery, exercised through the local runtime (no sandbox needed)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from polar.errors import ConfigError, RuntimeStartError
from polar.runtimes.local import LocalRuntime
from polar.schemas.task import RuntimeSpec

GATEWAY = "http://127.0.0.1:9/gw"


def make(tmp_path: Path, **spec: object) -> LocalRuntime:
    return LocalRuntime(RuntimeSpec(kind="local", **spec), tmp_path / "session", GATEWAY)


async def test_start_lays_out_the_session_and_runs_prepare(tmp_path: Path):
    rt = make(tmp_path, files={"a.txt": "alpha", "pkg/b.py": "B = 1\n"}, prepare=["cat a.txt > c"])
    await rt.start()
    try:
        for name in ("workspace", "home", "logs", "artifacts"):
            assert (rt.session_dir / name).is_dir()
        assert (rt.workspace_path / "pkg" / "b.py").read_text() == "B = 1\n"
        assert (rt.workspace_path / "c").read_text() == "alpha"
        assert "$ cat a.txt > c" in (rt.logs_path / "prepare.log").read_text()
        result = await rt.exec("pwd; echo $HOME")
        assert result.stdout.split() == [str(rt.workspace_path), str(rt.home_path)]
        assert rt.gateway_url_inside == GATEWAY
        assert not rt.capabilities.network_isolation and not rt.capabilities.filesystem_isolation
    finally:
        await rt.stop()


async def test_failing_prepare_raises_with_the_stderr_tail(tmp_path: Path):
    rt = make(tmp_path, prepare=["true", "echo doomed >&2; exit 3", "touch never"])
    with pytest.raises(RuntimeStartError) as info:
        await rt.start()
    assert info.value.exit_code == 3
    assert info.value.command == "echo doomed >&2; exit 3"
    assert "doomed" in info.value.stderr_tail and "doomed" in str(info.value)
    assert not (rt.workspace_path / "never").exists()
    assert not rt.running


def test_file_paths_must_stay_inside_the_workdir(tmp_path: Path):
    for bad in ("../escape", "/etc/passwd"):
        with pytest.raises(ConfigError):
            make(tmp_path, files={bad: "x"})
    with pytest.raises(ConfigError):
        make(tmp_path, network="bridge")


async def test_exec_env_layers_and_path_survives_the_login_shell(tmp_path: Path):
    rt = make(tmp_path, env={"A": "spec", "B": "spec"})
    await rt.start()
    try:
        result = await rt.exec(
            'echo "$A $B $C"; echo "$PATH"',
            env={"B": "exec", "C": "exec", "PATH": "/opt/x:/usr/bin"},
        )
        first, path = result.stdout.splitlines()
        assert first == "spec exec exec"
        assert path.startswith("/opt/x:/usr/bin:")  # not reset by /etc/profile
    finally:
        await rt.stop()


async def test_host_environment_does_not_leak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("POLAR_TEST_SECRET", "s3cret")
    rt = make(tmp_path)
    await rt.start()
    try:
        assert (await rt.exec("echo ${POLAR_TEST_SECRET:-none}")).stdout.strip() == "none"
    finally:
        await rt.stop()


async def test_argv_stdin_cwd_and_missing_programs(tmp_path: Path):
    rt = make(tmp_path, files={"sub/f": "x"})
    await rt.start()
    try:
        result = await rt.exec(
            [sys.executable, "-c", "import sys; print(sys.stdin.read()[::-1])"], stdin=b"abc"
        )
        assert result.ok and result.stdout.strip() == "cba"
        assert (await rt.exec("ls", cwd="sub")).stdout.split() == ["f"]
        missing = await rt.exec(["/no/such/program"])
        assert missing.exit_code == 127 and not missing.ok
        assert (await rt.exec("exit 7")).exit_code == 7
    finally:
        await rt.stop()


async def test_output_is_capped_keeping_head_and_tail(tmp_path: Path):
    rt = make(tmp_path, options={"output_limit_bytes": 1000})
    await rt.start()
    try:
        result = await rt.exec("echo START; head -c 100000 /dev/zero | tr '\\0' x; echo; echo END")
        assert result.stdout.startswith("START\n") and result.stdout.rstrip().endswith("END")
        assert "bytes elided" in result.stdout
        assert len(result.stdout) < 1100
    finally:
        await rt.stop()


async def test_timeout_kills_the_whole_process_tree(tmp_path: Path):
    rt = make(tmp_path)
    await rt.start()
    try:
        began = time.monotonic()
        result = await rt.exec(
            "(while true; do date +%s%N >> beat; sleep 0.05; done) & sleep 30", timeout_s=0.5
        )
        assert result.timed_out and result.exit_code < 0
        assert time.monotonic() - began < 5
        size = (rt.workspace_path / "beat").stat().st_size
        await asyncio.sleep(0.4)
        assert (rt.workspace_path / "beat").stat().st_size == size  # the background loop died
    finally:
        await rt.stop()


async def test_background_children_do_not_hang_an_exec(tmp_path: Path):
    rt = make(tmp_path)
    await rt.start()
    try:
        began = time.monotonic()
        result = await rt.exec("sleep 30 & echo started")
        assert result.ok and result.stdout.strip() == "started"
        assert time.monotonic() - began < 5
    finally:
        await rt.stop()


async def test_cancel_kills_running_execs_and_stop_is_idempotent(tmp_path: Path):
    rt = make(tmp_path)
    await rt.start()
    task = asyncio.create_task(rt.exec("sleep 30"))
    await asyncio.sleep(0.3)
    began = time.monotonic()
    await rt.cancel()
    result = await asyncio.wait_for(task, 5)
    assert result.exit_code == -9 and not result.timed_out
    assert time.monotonic() - began < 5
    await rt.stop()
    await rt.stop()
    with pytest.raises(RuntimeStartError):
        await rt.exec("true")


async def test_a_cancelled_exec_task_kills_its_process(tmp_path: Path):
    rt = make(tmp_path)
    await rt.start()
    try:
        task = asyncio.create_task(rt.exec("while true; do date >> beat; sleep 0.05; done"))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        size = (rt.workspace_path / "beat").stat().st_size
        await asyncio.sleep(0.3)
        assert (rt.workspace_path / "beat").stat().st_size == size
    finally:
        await rt.stop()


async def test_upload_and_download_files_and_trees(tmp_path: Path):
    rt = make(tmp_path)
    await rt.start()
    try:
        src = tmp_path / "src"
        (src / "d").mkdir(parents=True)
        (src / "d" / "x.txt").write_text("x")
        (src / "top.txt").write_text("top")
        await rt.upload(src, "in")
        await rt.upload(src / "top.txt", "one/top.txt")
        assert (await rt.exec("cat in/d/x.txt one/top.txt")).stdout == "xtop"
        await rt.exec("mkdir -p out && echo made > out/m.txt")
        await rt.download("out", tmp_path / "back")
        assert (tmp_path / "back" / "m.txt").read_text() == "made\n"
        with pytest.raises(FileNotFoundError):
            await rt.download("nothing-here", tmp_path / "nope")
    finally:
        await rt.stop()


async def test_limits_pin_cpus_and_cap_address_space(tmp_path: Path):
    rt = make(tmp_path, cpus=1, memory_mb=256)
    await rt.start()
    try:
        assert rt.capabilities.resource_limits == {"cpus", "memory"}
        allowed = await rt.exec("grep Cpus_allowed_list /proc/self/status")
        assert allowed.stdout.split()[-1].isdigit()  # exactly one core
        hog = await rt.exec([sys.executable, "-c", "b = bytearray(600 * 1024 * 1024)"])
        assert hog.exit_code != 0 and "MemoryError" in hog.stderr
    finally:
        await rt.stop()
