"""The live view of a run: sessions by stage, calls captured, tokens, rewards as they land.

It reads only what any client could: the rollout server through the typed client (whose
``wait`` follows the server's event stream and decides when the run is over) and the gateway's
capture store; the table is redrawn twice a second. On a terminal it redraws in place; in a log
(CI) it prints one line per finished session instead of redrawing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from polar.capture.store import CaptureStore
from polar.client import RolloutClient, RolloutTimeout
from polar.schemas.task import SessionStatus

REDRAW_S = 0.5
# Session statuses grouped into the stages the view shows.
STAGE_OF = {
    "REGISTERED": "queued",
    "INITIALIZING": "init",
    "READY": "ready",
    "RUNNING": "running",
    "POST_RUN": "post-run",
    "BUILDING": "post-run",
    "EVALUATING": "post-run",
    "COMPLETED": "done",
    "TIMEOUT": "done",
    "ERROR": "done",
}
STAGES = ("queued", "init", "ready", "running", "post-run", "done")


@dataclass
class Snapshot:
    """What the view knows at one poll."""

    sessions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    calls: int = 0
    prompt_tokens: int = 0
    sampled_tokens: int = 0
    elapsed_s: float = 0.0

    def finished(self) -> list[dict[str, Any]]:
        return [s for views in self.sessions.values() for s in views if _final(s)]

    @property
    def all_done(self) -> bool:
        views = [s for v in self.sessions.values() for s in v]
        return bool(views) and all(_final(s) for s in views)


class RunProgress:
    """Shows the run until the client's wait says every task is finished."""

    def __init__(
        self,
        client: RolloutClient,
        store: CaptureStore,
        task_ids: list[str],
        console: Console,
    ) -> None:
        self.client = client
        self.store = store
        self.task_ids = task_ids
        self.console = console
        self.started = time.monotonic()
        self._reported: set[str] = set()

    def watch(self, deadline_s: float, stop: Callable[[], bool] = lambda: False) -> Snapshot:
        """Show progress until all sessions are final, ``deadline_s`` passes or ``stop()`` says
        so (returns the last snapshot either way; Ctrl-C propagates to the caller)."""
        waiting = self.client.start_wait(self.task_ids, deadline_s)
        snapshot = self.poll()
        try:
            with Live(
                self.render(snapshot), console=self.console, refresh_per_second=4, transient=False
            ) as live:
                while not _settled(waiting, REDRAW_S) and not stop():
                    snapshot = self.poll()
                    live.update(self.render(snapshot))
                    if not self.console.is_terminal:
                        self._log_finished(snapshot)
                snapshot = self.poll()
                live.update(self.render(snapshot))
                if not self.console.is_terminal:
                    self._log_finished(snapshot)
        finally:
            waiting.cancel()
        self.console.print()
        return snapshot

    def poll(self) -> Snapshot:
        snapshot = Snapshot(elapsed_s=time.monotonic() - self.started)
        for task_id in self.task_ids:
            views = self.client.sessions(task_id)
            snapshot.sessions[task_id] = [v.model_dump(mode="json") for v in views]
        for session_id in self.store.session_ids():
            for call in self.store.summaries(session_id):
                snapshot.calls += 1
                snapshot.prompt_tokens += int(call["n_prompt"] or 0)
                snapshot.sampled_tokens += int(call["n_sampled"] or 0)
        return snapshot

    def render(self, snapshot: Snapshot) -> Group:
        table = Table(title="sessions by stage", title_justify="left", expand=False)
        table.add_column("task")
        for stage in STAGES:
            table.add_column(stage, justify="right")
        table.add_column("rewards (by sample)")
        for task_id in self.task_ids:
            views = snapshot.sessions.get(task_id, [])
            counts = dict.fromkeys(STAGES, 0)
            for view in views:
                counts[STAGE_OF.get(view["status"], "queued")] += 1
            table.add_row(task_id, *(_count(counts[s]) for s in STAGES), _rewards(views))
        rewards = [s["reward"] for s in snapshot.finished() if s.get("reward") is not None]
        mean = f"{sum(rewards) / len(rewards):.2f}" if rewards else "-"
        footer = Text(
            f"calls captured {snapshot.calls}   prompt tokens {snapshot.prompt_tokens:,}   "
            f"sampled tokens {snapshot.sampled_tokens:,}   mean reward {mean}   "
            f"elapsed {snapshot.elapsed_s:.0f}s"
        )
        return Group(table, footer)

    def _log_finished(self, snapshot: Snapshot) -> None:
        for view in snapshot.finished():
            if view["session_id"] in self._reported:
                continue
            self._reported.add(view["session_id"])
            self.console.print(
                f"[{snapshot.elapsed_s:5.0f}s] {view['task_id']} sample {view['sample_index']}: "
                f"{view['status']} reward {view.get('reward')}"
                + (f" ({view['error'][:120]})" if view.get("error") else "")
            )


def _count(n: int) -> str:
    return str(n) if n else "·"


def _rewards(views: list[dict[str, Any]]) -> Text:
    """One mark per sample: the reward once scored, the status otherwise."""
    text = Text()
    for view in sorted(views, key=lambda v: v["sample_index"]):
        reward = view.get("reward")
        if not _final(view):
            text.append("… ", style="dim")
        elif reward is None:
            text.append(f"{view['status'].lower()} ", style="red")
        else:
            text.append(f"{reward:g} ", style="green" if reward > 0 else "yellow")
    return text


def _final(view: dict[str, Any]) -> bool:
    return SessionStatus(view["status"]).finished


def _settled(waiting: Any, within_s: float) -> bool:
    """Whether the wait ended (done, timed out or cancelled), waiting at most ``within_s``."""
    try:
        waiting.result(timeout=within_s)
    except FutureTimeout:
        return False
    except (RolloutTimeout, CancelledError):
        return True
    return True
