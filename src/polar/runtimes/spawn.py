"""Starting a host process that inherits nothing but its stdio, whatever the event loop runs.

A gateway node holds descriptors no harness may see: its listening socket, the rollout
server's connections, the capture store, and under Ray about twenty of Ray's log files, opened
without close-on-exec. ``asyncio.create_subprocess_exec`` closes them in the child only on the
standard loop: uvloop (uvicorn's default) ignores ``close_fds``, and a sandboxed harness then
``accept()``s the node's own control traffic. :func:`spawn` starts every runtime process through
:class:`subprocess.Popen` with ``close_fds=True`` and no ``pass_fds`` (the child closes every
descriptor above 2 before it execs) and connects the pipes to the running loop itself.

Under uvloop a pipe handed to the loop is closed twice: libuv closes the descriptor, then uvloop
closes the file object too (expecting EBADF). In a process with several threads, another thread
may have opened a descriptor under that number in between, and the second close takes it: a
sandbox launch elsewhere then failed with "[Errno 9] Bad file descriptor". :func:`_for_loop`
gives uvloop a private duplicate in a file object that never closes it, so each descriptor is
closed exactly once.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

_POLL_MAX_S = 0.05


@dataclass
class Child:
    """A spawned process: its pid, its pipes as asyncio streams, and its exit status."""

    popen: subprocess.Popen[bytes]
    stdin: asyncio.StreamWriter | None
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    transports: list[asyncio.BaseTransport] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once the process ended (negative N: killed by signal N)."""
        return self.popen.poll()

    async def exited(self) -> int:
        """The exit status as soon as the process ends, without waiting for its pipes to
        close (a background child that inherited them can hold them open forever)."""
        delay = 0.005
        while (code := self.returncode) is None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)
        return code

    def close(self) -> None:
        """Release the pipes (a straggler that kept them open no longer holds ours)."""
        for transport in self.transports:
            transport.close()


async def spawn(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    with_stdin: bool = False,
    new_session: bool = False,
) -> Child:
    """Start ``argv`` with stdout and stderr piped (stdin piped if ``with_stdin``, else
    ``/dev/null``) and every other descriptor closed. Raises :class:`OSError` when it cannot
    start (a missing program, no permission)."""
    popen = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        close_fds=True,
        pass_fds=(),
        start_new_session=new_session,
    )
    child = Child(popen, None, asyncio.StreamReader(), asyncio.StreamReader())
    loop = asyncio.get_running_loop()
    try:
        for reader, pipe in ((child.stdout, popen.stdout), (child.stderr, popen.stderr)):
            transport, _ = await loop.connect_read_pipe(
                functools.partial(asyncio.StreamReaderProtocol, reader), _for_loop(loop, pipe)
            )
            child.transports.append(transport)
        if popen.stdin is not None:
            # StreamReaderProtocol brings the flow control StreamWriter.drain() needs.
            protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader())
            writer, _ = await loop.connect_write_pipe(
                lambda: protocol, _for_loop(loop, popen.stdin)
            )
            child.transports.append(writer)
            child.stdin = asyncio.StreamWriter(writer, protocol, None, loop)
    except BaseException:
        popen.kill()
        popen.wait()
        child.close()
        raise
    return child


def _for_loop(loop: asyncio.AbstractEventLoop, pipe: IO[bytes] | None) -> IO[bytes]:
    """The pipe object to hand to ``loop``: the pipe itself on asyncio's loops (the transport
    closes it, once); on uvloop, which closes the descriptor and then the object, a duplicate
    descriptor in an object that leaves closing to libuv, the original closed here."""
    assert pipe is not None
    if not type(loop).__module__.startswith("uvloop"):
        return pipe
    duplicate = os.dup(pipe.fileno())
    mode = "wb" if pipe.writable() else "rb"
    pipe.close()
    return open(duplicate, mode, buffering=0, closefd=False)  # libuv closes it
