"""Runtime lookup by name or import path, and the rootless limit helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar.errors import ConfigError
from polar.runtimes.base import Capabilities, Launch, Runtime
from polar.runtimes.bubblewrap import BubblewrapRuntime
from polar.runtimes.limits import limit_prefix, pinned_cores
from polar.runtimes.local import LocalRuntime
from polar.runtimes.registry import RUNTIMES, create_runtime
from polar.schemas.task import RuntimeSpec


class EchoRuntime(Runtime):
    """A custom runtime, found through ``module:Class``."""

    name = "echo"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(False, False, False)

    def _launch(self, argv: list[str], env: dict[str, str], cwd: str, exec_id: str) -> Launch:
        return Launch(["echo", *argv], env)


def test_names_and_import_paths(tmp_path: Path):
    assert RUNTIMES.names() == ["apptainer", "bubblewrap", "docker", "local"]
    rt = create_runtime(RuntimeSpec(kind="local"), tmp_path, "http://127.0.0.1:1")
    assert isinstance(rt, LocalRuntime) and rt.session_dir == tmp_path
    assert isinstance(create_runtime(RuntimeSpec(), tmp_path, "http://g:1"), BubblewrapRuntime)
    with pytest.raises(ConfigError, match="unknown runtime"):
        create_runtime(RuntimeSpec(kind="vm"), tmp_path, "http://g:1")


async def test_a_module_class_runtime_gets_the_shared_machinery(tmp_path: Path):
    kind = f"{__name__}:EchoRuntime"
    rt = create_runtime(RuntimeSpec(kind=kind, files={"f": "x"}), tmp_path / "s", "http://g:1")
    await rt.start()
    try:
        assert (rt.workspace_path / "f").read_text() == "x"
        assert (await rt.exec(["hi", "there"])).stdout == "hi there\n"
    finally:
        await rt.stop()


@pytest.mark.parametrize(
    ("kind", "image", "typo", "allowed"),
    [
        ("local", None, "inherit_environment", "inherit_env"),
        ("bubblewrap", None, "ro_bind", "ro_binds"),
        ("docker", "img", "runargs", "run_args"),
        ("apptainer", "img.sif", "forwarder_pyhton", "forwarder_python"),
    ],
)
def test_a_misspelt_option_is_an_error_naming_the_runtime_and_the_key(
    tmp_path: Path, kind: str, image: str | None, typo: str, allowed: str
):
    spec = RuntimeSpec(kind=kind, image=image, options={typo: True})
    with pytest.raises(ConfigError) as caught:
        create_runtime(spec, tmp_path, "http://127.0.0.1:1")
    message = str(caught.value)
    assert f"the {kind} runtime" in message
    assert f"{typo}: unknown key" in message and allowed in message


def test_options_are_typed_and_checked(tmp_path: Path):
    spec = RuntimeSpec(kind="bubblewrap", options={"ro_binds": ["/opt/node"], "gateway_port": 9})
    rt = create_runtime(spec, tmp_path, "http://127.0.0.1:1")
    assert isinstance(rt, BubblewrapRuntime)
    assert rt.options.ro_binds == ["/opt/node"] and rt.options.gateway_port == 9
    with pytest.raises(ConfigError, match="output_limit_bytes"):
        create_runtime(
            RuntimeSpec(kind="local", options={"output_limit_bytes": "lots"}),
            tmp_path,
            "http://g:1",
        )
    kind = f"{__name__}:EchoRuntime"
    with pytest.raises(ConfigError, match="the echo runtime"):
        create_runtime(
            RuntimeSpec(kind=kind, options={"inherit_env": True}), tmp_path, "http://g:1"
        )


def test_pinned_cores_round_up_and_spread():
    cores = list(range(8))
    assert len(pinned_cores(0.5, cores, "a")) == 1
    assert len(pinned_cores(2.1, cores, "a")) == 3
    assert pinned_cores(64, cores, "a") == cores
    starts = {pinned_cores(1, cores, f"session-{i}")[0] for i in range(64)}
    assert len(starts) > 4  # sessions do not all land on one core


def test_limit_prefix():
    spec = RuntimeSpec(cpus=2, memory_mb=100)
    assert limit_prefix(spec, "k", available=[4, 5]) == [
        "taskset", "-c", "4,5", "prlimit", f"--as={100 * 1024 * 1024}", "--",
    ]  # fmt: skip
    assert limit_prefix(RuntimeSpec(), "k") == []
