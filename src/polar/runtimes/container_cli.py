"""Running a container CLI command (``docker``, ``apptainer``) to completion, bounded in time."""

from __future__ import annotations

import asyncio

from polar.errors import RuntimeStartError
from polar.runtimes.base import tail_text
from polar.runtimes.spawn import spawn

CLI_TIMEOUT_S = 120.0


async def run_cli(argv: list[str], timeout_s: float = CLI_TIMEOUT_S) -> tuple[int, str, str]:
    """Run a container CLI command to completion; (exit code, stdout, stderr)."""
    proc = await spawn(argv)
    try:
        async with asyncio.timeout(timeout_s):
            out, err, code = await asyncio.gather(
                proc.stdout.read(), proc.stderr.read(), proc.exited()
            )
    except TimeoutError:
        proc.popen.kill()
        await proc.exited()
        return -9, "", f"{argv[0]} {argv[1]} timed out after {timeout_s:g}s"
    finally:
        proc.close()
    return code, out.decode(errors="replace"), err.decode(errors="replace")


async def run_cli_checked(argv: list[str], failure: str, timeout_s: float = CLI_TIMEOUT_S) -> str:
    """Run a container CLI command that must succeed; its stdout, or a
    :class:`RuntimeStartError` that says ``failure`` with the command, its exit code and
    stderr."""
    code, out, err = await run_cli(argv, timeout_s)
    if code != 0:
        raise RuntimeStartError(
            f"{failure} (exit {code})",
            command=" ".join(argv),
            exit_code=code,
            stderr_tail=tail_text(err),
        )
    return out
