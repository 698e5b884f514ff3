"""One local run: the options the local commands share, their set-up, and :class:`LocalRun`.

``polar quickstart`` and ``polar generate`` do the same things around their own tasks: choose
the runtime, open the engine, install the harness, start a :class:`LocalStack` in front of the
engine, submit, follow until done, a deadline or Ctrl-C, and tear everything down in the order
that still delivers the unfinished sessions' results. That skeleton lives here once; a command
supplies its tasks, how it watches them, and what it writes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from rich.console import Console

from polar.client import RolloutClient
from polar.schemas.sampling import SamplingPolicy
from polar.schemas.task import TaskRequest
from polar.stack.loading import quiet_while_loading
from polar.stack.local import LocalStack
from polar.stack.plan import (
    DEFAULT_HARNESS,
    EngineHandle,
    HarnessPlan,
    choose_harness,
    choose_runtime,
    open_engine,
)


@dataclass(frozen=True)
class LocalRunOptions:
    """What every local command asks: the harness and its sandbox, the session budget, the
    sampling, and the engine (embedded ``model``, or the server at ``engine_url``)."""

    harness: str = DEFAULT_HARNESS
    runtime: str | None = None
    max_turns: int = 6
    timeout_s: float = 180.0
    max_tokens: int | None = None
    temperature: float = 0.7
    model: str = "smollm2"
    engine_url: str | None = None
    engine_kind: str = "vllm"
    served_model: str | None = None
    tokenizer: str | None = None
    threads: int | None = None


@dataclass
class RunSetup:
    """The runtime, engine and harness a run uses; ``owns_engine``: the run closes it."""

    runtime: str
    engine: EngineHandle
    harness: HarnessPlan
    owns_engine: bool = True

    def announce(self, console: Console) -> None:
        """Print the harness plan's warnings and notes."""
        for text in self.harness.warnings:
            warn(console, text)
        for text in self.harness.notes:
            console.print(f"[dim]note: {text}[/]")


def warn(console: Console, text: str) -> None:
    console.print(f"[yellow]warning:[/] {text}")


def set_up(
    options: LocalRunOptions,
    console: Console,
    *,
    batch: int,
    stock_prompt: bool,
    background: bool = False,
    engine: EngineHandle | None = None,
    owns_engine: bool = True,
) -> RunSetup:
    """Choose the runtime, open the engine (unless given), make sure the harness is installed.

    With ``background`` the embedded model loads on a thread while the servers and harnesses
    start (:mod:`polar.stack.loading`); the engine is closed again if the harness fails."""
    runtime = choose_runtime(options.runtime, lambda text: warn(console, text))
    if engine is None:
        with _engine_status(options, console, background):
            engine = open_engine(
                model=options.model,
                engine_url=options.engine_url,
                engine_kind=options.engine_kind,
                served_model=options.served_model,
                tokenizer=options.tokenizer,
                threads=options.threads,
                batch=batch,
                background=background,
            )
    try:
        harness = choose_harness(
            options.harness,
            max_turns=options.max_turns,
            model_name=engine.served_model or "polar",
            stock_prompt=stock_prompt,
            echo=lambda line: console.print(f"  {line}", markup=False),
        )
    except BaseException:
        if owns_engine:
            engine.close()
        raise
    return RunSetup(runtime, engine, harness, owns_engine)


def _engine_status(
    options: LocalRunOptions, console: Console, background: bool
) -> contextlib.AbstractContextManager[object]:
    """A spinner while the engine opens: a remote one always, a model loading here only when
    it loads in the foreground."""
    if options.engine_url:
        return console.status("engine ...")
    return contextlib.nullcontext() if background else console.status("loading the model ...")


@dataclass(frozen=True)
class Followed:
    """How following a run ended: the task ids submitted, and whether every session ended
    (``finished``) or the user pressed Ctrl-C (``interrupted``)."""

    submitted: list[str]
    finished: bool
    interrupted: bool


class LocalRun:
    """A :class:`LocalStack` in front of a run's engine, with a client of its rollout server.

    ``with LocalRun(...) as run:`` starts the stack and opens the client; :meth:`follow`
    submits, watches and winds down; leaving the block closes the client and stops the stack,
    whatever happened.
    """

    def __init__(
        self,
        setup: RunSetup,
        work_dir: Path,
        console: Console,
        *,
        sampling: SamplingPolicy,
        run_workers: int,
        ready_buffer: int,
        postrun_workers: int = 2,
    ) -> None:
        self.setup = setup
        self.console = console
        engine = setup.engine
        self.stack = LocalStack(
            engine.engine,
            work_dir,
            engine_config=engine.config,
            served_model=engine.served_model,
            context_window=engine.context_window,
            policy_version=engine.policy_version,
            sampling=sampling,
            runtime=setup.runtime,
            run_workers=run_workers,
            postrun_workers=postrun_workers,
            ready_buffer=ready_buffer,
            tokenizer=engine.tokenizer,
        )
        self._client: RolloutClient | None = None

    @property
    def client(self) -> RolloutClient:
        assert self._client is not None, "run not started"
        return self._client

    def __enter__(self) -> LocalRun:
        try:
            with quiet_while_loading():
                self.stack.start()
            self.setup.engine.expect_calls()
            self._client = RolloutClient(self.stack.rollout_url, token=self.stack.rollout_token)
        except BaseException:
            self.stack.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._client is not None:
                self._client.close()
        finally:
            self.stack.stop()

    def follow(
        self,
        requests: list[TaskRequest],
        watch: Callable[[list[str]], bool],
        *,
        on_interrupt: str,
        after_interrupt: Callable[[], None] | None = None,
    ) -> Followed:
        """Submit ``requests`` and ``watch`` the submitted tasks (it returns whether all ended
        before its deadline); on Ctrl-C say ``on_interrupt`` and call ``after_interrupt``.

        Then wind down: the engine closes (so calls of timed-out or cancelled sessions end)
        and the gateway node stops, cancelling unfinished sessions and delivering their
        results to the rollout server, which the client can still read."""
        submitted: list[str] = []
        finished = interrupted = False
        try:
            for request in requests:
                self.client.submit(request)
                submitted.append(request.task_id)
            finished = watch(submitted)
            if self.setup.engine.failed():
                self.console.print("[red]error:[/] the model failed to load; stopping")
            elif not finished:
                warn(self.console, "the run's deadline passed; stopping")
        except KeyboardInterrupt:
            interrupted = True
            self.console.print(f"[yellow]interrupted:[/] {on_interrupt}")
            if after_interrupt is not None:
                with contextlib.suppress(Exception):
                    after_interrupt()
        if self.setup.owns_engine:
            self.setup.engine.close()
        self.stack.stop_gateway()
        return Followed(submitted, finished, interrupted)


@contextlib.contextmanager
def closing_engine(setup: RunSetup) -> Iterator[RunSetup]:
    """Close the run's engine on the way out when the run owns it."""
    try:
        yield setup
    finally:
        if setup.owns_engine:
            setup.engine.close()
