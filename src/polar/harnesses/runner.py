"""Running a harness launch inside a runtime: write its files, start it, bound its time.

Every way a harness can fail ends as a :class:`HarnessError` that carries the CLI's stderr tail
(or :class:`HarnessTimeout` when it ran out of time), never as a hang: the runtime kills the
whole process tree at the deadline.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from polar.errors import HarnessError, HarnessTimeout
from polar.harnesses.base import HarnessLaunch
from polar.runtimes.base import Runtime

TAIL_CHARS = 4000
_PROBE_TIMEOUT_S = 30.0
# Prints the first missing path: the program (on PATH or absolute), then the script if given.
_PROBE = 'command -v -- "$1" >/dev/null || { echo "$1"; exit 1; }; [ -z "$2" ] || [ -e "$2" ] || { echo "$2"; exit 1; }'


@dataclass(frozen=True)
class HarnessOutcome:
    """How a harness run ended (the tails are the last :data:`TAIL_CHARS` characters)."""

    exit_code: int
    stdout_tail: str
    stderr_tail: str
    duration_s: float


async def run_launch(
    launch: HarnessLaunch, runtime: Runtime, *, timeout_s: float | None, harness: str = "harness"
) -> HarnessOutcome:
    """Write the launch's files into ``runtime``, run its argv, and check how it ended.

    Raises :class:`HarnessError` when the CLI is missing or exits non-zero, and
    :class:`HarnessTimeout` when it is killed at ``timeout_s`` (None: the caller bounds it).
    """
    await write_files(launch, runtime)
    await _check_executable(launch, runtime, harness)
    result = await runtime.exec(launch.argv, env=launch.env, timeout_s=timeout_s, cwd=launch.cwd)
    outcome = HarnessOutcome(
        exit_code=result.exit_code,
        stdout_tail=result.stdout[-TAIL_CHARS:],
        stderr_tail=result.stderr[-TAIL_CHARS:],
        duration_s=result.duration_s,
    )
    if result.timed_out:
        message = f"{harness} did not finish within {timeout_s:g}s and was killed"
        raise _failure(HarnessTimeout, message, harness, outcome)
    if result.exit_code != 0:
        message = f"{harness} exited with status {result.exit_code}"
        raise _failure(HarnessError, message, harness, outcome)
    return outcome


async def write_files(launch: HarnessLaunch, runtime: Runtime) -> None:
    """Put the launch's config files where the CLI will look (paths in the runtime's view)."""
    with tempfile.TemporaryDirectory(prefix="polar-harness-") as tmp:
        for index, (remote, content) in enumerate(launch.files.items()):
            local = Path(tmp) / str(index)
            local.write_text(content)
            await runtime.upload(local, remote)


async def _check_executable(launch: HarnessLaunch, runtime: Runtime, harness: str) -> None:
    """A missing CLI gets its own message (a bare exit 127 says little)."""
    program = launch.argv[0]
    # A Node CLI is argv[0]=node plus its script: both must be there.
    script = launch.argv[1] if len(launch.argv) > 1 and launch.argv[1].startswith("/") else ""
    probe = await runtime.exec(
        ["bash", "-c", _PROBE, "_", program, script],
        env=launch.env,
        timeout_s=_PROBE_TIMEOUT_S,
        cwd=launch.cwd,
    )
    if probe.exit_code == 0:
        return
    missing = probe.stdout.strip() or program
    hint = (
        f"; install it with: polar harness install {harness}"
        if missing.startswith("/")
        else " (not on PATH)"
    )
    raise HarnessError(
        f"{harness} CLI not found: {missing}{hint}",
        harness=harness,
        exit_code=probe.exit_code,
        stderr_tail=probe.stderr[-TAIL_CHARS:],
    )


def _failure(
    kind: type[HarnessError], message: str, harness: str, outcome: HarnessOutcome
) -> HarnessError:
    return kind(
        message,
        harness=harness,
        exit_code=outcome.exit_code,
        stdout_tail=outcome.stdout_tail,
        stderr_tail=outcome.stderr_tail or outcome.stdout_tail,
    )
