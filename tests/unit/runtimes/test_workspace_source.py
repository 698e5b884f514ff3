"""RuntimeSpec.source through the runtimes: the starting tree laid before ``files``, the same
for every fresh runtime of a spec, and git working on it inside a sandbox."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from images.local_image import IMAGE, build_task_image, task_image_unready
from polar.errors import ConfigError
from polar.runtimes.bubblewrap import BubblewrapRuntime
from polar.runtimes.docker import DockerRuntime
from polar.runtimes.local import LocalRuntime
from polar.schemas.task import GitSource, ImageSource, RuntimeSpec

from .conftest import GitRepo, git


def tree_of(root: Path) -> dict[str, str]:
    """Every file below ``root`` outside .git: its content, or where a link points."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel == ".git" or rel.startswith(".git/"):
            continue
        if path.is_symlink():
            found[rel] = "-> " + str(path.readlink())
        elif path.is_file():
            found[rel] = path.read_text()
    return found


def git_spec(repo: GitRepo, **spec: object) -> RuntimeSpec:
    source = GitSource(kind="git", repo=str(repo.path), commit=repo.first)
    return RuntimeSpec(source=source, **spec)  # type: ignore[arg-type]


async def test_files_are_written_over_the_checkout(git_repo: GitRepo, tmp_path: Path):
    spec = git_spec(git_repo, kind="local", files={"app.py": "VALUE = 3\n", "new.txt": "n"})
    rt = LocalRuntime(spec, tmp_path / "s1", "http://127.0.0.1:9")
    await rt.start()
    try:
        assert (rt.workspace_path / "app.py").read_text() == "VALUE = 3\n"
        assert (rt.workspace_path / "link.py").is_symlink()
        status = await rt.exec("git status --porcelain; git rev-parse HEAD")
        assert status.stdout.splitlines() == [" M app.py", "?? new.txt", git_repo.first]
    finally:
        await rt.stop()
    # A fresh runtime of the same spec starts from the same tree (evaluators diff against it).
    fresh = LocalRuntime(spec, tmp_path / "s2", "http://127.0.0.1:9")
    await fresh.start()
    await fresh.stop()
    assert tree_of(fresh.workspace_path) == tree_of(rt.workspace_path)
    assert git(fresh.workspace_path, "rev-parse", "HEAD") == git_repo.first


async def test_the_agents_changes_stay_in_its_own_workspace(git_repo: GitRepo, tmp_path: Path):
    spec = git_spec(git_repo, kind="local")
    rt = LocalRuntime(spec, tmp_path / "s1", "http://127.0.0.1:9")
    await rt.start()
    await rt.exec("echo broken > app.py && git add -A")
    await rt.stop()
    fresh = LocalRuntime(spec, tmp_path / "s2", "http://127.0.0.1:9")
    await fresh.start()
    await fresh.stop()
    assert (fresh.workspace_path / "app.py").read_text() == "VALUE = 1\n"
    assert git(fresh.workspace_path, "status", "--porcelain") == ""


@pytest.mark.parametrize("runtime", [LocalRuntime, BubblewrapRuntime])
async def test_an_image_source_needs_a_runtime_with_an_image(
    tmp_path: Path, runtime: type[LocalRuntime] | type[BubblewrapRuntime]
):
    spec = RuntimeSpec(kind=runtime.name, source=ImageSource(kind="image"))
    rt = runtime(spec, tmp_path / "s", "http://127.0.0.1:9")
    with pytest.raises(ConfigError, match=f"the {runtime.name} runtime has no image"):
        await rt.start()
    assert not rt.running


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")
async def test_git_works_inside_bubblewrap_on_the_seeded_workspace(
    git_repo: GitRepo, tmp_path: Path, gateway_url: str
):
    spec = git_spec(git_repo, kind="bubblewrap", files={"extra.txt": "x"})
    rt = BubblewrapRuntime(spec, tmp_path / "s", gateway_url)
    await rt.start()
    try:
        result = await rt.exec("id -u; git rev-parse HEAD; git status --porcelain")
        assert result.ok, result.stderr
        assert result.stdout.splitlines() == ["65534", git_repo.first, "?? extra.txt"]
        diff = await rt.exec("echo 'VALUE = 9' > app.py && git diff --stat")
        assert diff.ok and "app.py" in diff.stdout, diff.stderr
    finally:
        await rt.stop()


@pytest.mark.slow
async def test_live_docker_seeds_the_workspace_from_the_image(
    git_repo: GitRepo, tmp_path: Path, gateway_url: str
):
    if reason := task_image_unready(IMAGE):
        pytest.skip(reason)
    image = f"polar-test-task:{secrets.token_hex(4)}"
    build_task_image(image, git_repo.path)
    try:
        spec = RuntimeSpec(
            kind="docker",
            image=image,
            workdir="/testbed",
            source=ImageSource(kind="image"),
            files={"extra.txt": "x"},
        )
        rt = DockerRuntime(spec, tmp_path / "s", gateway_url)
        await rt.start()
        try:
            assert (rt.workspace_path / ".git").is_dir()
            assert (rt.workspace_path / "notes.txt").read_text() == "later\n"
            result = await rt.exec("id -u; git rev-parse HEAD; git status --porcelain")
            assert result.ok, result.stderr
            assert result.stdout.splitlines() == ["65534", git_repo.second, "?? extra.txt"]
            assert (await rt.exec("python3 -m pytest --version")).ok
            if os.geteuid() == 0:
                # Files of another owner (what a non-root host's hand-over leaves): git trusts
                # the workspace through the runtime's environment, not the repository's config.
                for path in (rt.workspace_path, *rt.workspace_path.rglob("*")):
                    os.chown(path, 4242, 4242, follow_symlinks=False)
                assert (await rt.exec("git rev-parse HEAD")).stdout.strip() == git_repo.second
                untrusted = await rt.exec("git status", env={"GIT_CONFIG_COUNT": "0"})
                assert "dubious ownership" in untrusted.stderr
        finally:
            await rt.stop()
    finally:
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True)
