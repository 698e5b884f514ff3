"""Every descriptor a spawned child's pipes use is closed exactly once, whatever the loop.

uvloop closes a pipe's descriptor in libuv and then closes the file object it was handed; with
that object owning the same number, the second close could take a descriptor another thread had
just opened (a sandbox launch failed with "[Errno 9] Bad file descriptor" in CI)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from polar.runtimes.spawn import Child, spawn

uvloop = pytest.importorskip("uvloop", reason="uvloop (uvicorn[standard]) is not installed")


async def echo_through_cat() -> tuple[Child, list[Any]]:
    child = await spawn(["cat"], with_stdin=True)
    assert child.stdin is not None
    child.stdin.write(b"hello")
    await child.stdin.drain()
    child.stdin.close()
    assert await child.stdout.read() == b"hello"
    assert await child.exited() == 0
    pipes = [t.get_extra_info("pipe") for t in child.transports]
    child.close()
    await asyncio.sleep(0.05)  # the transports finish closing
    return child, pipes


def run(loop: str, main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return uvloop.run(main()) if loop == "uvloop" else asyncio.run(main())


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_child_leaves_no_descriptor_behind(loop: str) -> None:
    async def main() -> tuple[int, int]:
        await echo_through_cat()  # the loop's own descriptors are open from here on
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(20):
            await echo_through_cat()
        return before, len(os.listdir("/proc/self/fd"))

    before, after = run(loop, main)
    assert after == before


def test_under_uvloop_the_loop_never_closes_a_descriptor_a_second_time() -> None:
    """libuv closes the descriptor; the object uvloop closes after it must not own one, and
    the Popen's own pipe objects are closed already (by us, once)."""

    async def main() -> tuple[Child, list[Any]]:
        return await echo_through_cat()

    child, pipes = run("uvloop", main)
    assert len(pipes) == 3
    assert all(pipe.closefd is False for pipe in pipes)
    popen = child.popen
    assert all(p is not None and p.closed for p in (popen.stdin, popen.stdout, popen.stderr))
