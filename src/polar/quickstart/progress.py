"""The live view of a run: sessions by stage, calls captured, tokens, rewards as they land.

It reads only what any client could: the rollout server's session listing (over HTTP) and the
gateway's capture store, polled a few times a second. On a terminal it redraws in place; in a
log (CI) it prints one line per finished session instead of redrawing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from polar.capture.store import CaptureStore

POLL_S = 0.5
FINAL = ("COMPLETED", "TIMEOUT", "ERROR")
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
        return [s for views in self.sessions.values() for s in views if s["status"] in FINAL]

    @property
    def all_done(self) -> bool:
        views = [s for v in self.sessions.values() for s in v]
        return bool(views) and all(s["status"] in FINAL for s in views)


class RunProgress:
    """Polls the rollout server and the capture store until every task is finished."""

    def __init__(
        self,
        rollout_url: str,
        store: CaptureStore,
        task_ids: list[str],
        console: Console,
        *,
        token: str | None = None,
    ) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=rollout_url, headers=headers, timeout=10)
        self.store = store
        self.task_ids = task_ids
        self.console = console
        self.started = time.monotonic()
        self._reported: set[str] = set()

    def watch(self, deadline_s: float) -> Snapshot:
        """Show progress until all sessions are final or ``deadline_s`` passes (returns the last
        snapshot either way; Ctrl-C propagates to the caller)."""
        snapshot = self.poll()
        try:
            with Live(
                self.render(snapshot), console=self.console, refresh_per_second=4, transient=False
            ) as live:
                while not snapshot.all_done and time.monotonic() - self.started < deadline_s:
                    time.sleep(POLL_S)
                    snapshot = self.poll()
                    live.update(self.render(snapshot))
                    if not self.console.is_terminal:
                        self._log_finished(snapshot)
        finally:
            self.http.close()
        self.console.print()
        return snapshot

    def poll(self) -> Snapshot:
        snapshot = Snapshot(elapsed_s=time.monotonic() - self.started)
        for task_id in self.task_ids:
            reply = self.http.get(f"/tasks/{task_id}/sessions")
            snapshot.sessions[task_id] = reply.json() if reply.status_code == 200 else []
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
        if view["status"] not in FINAL:
            text.append("… ", style="dim")
        elif reward is None:
            text.append(f"{view['status'].lower()} ", style="red")
        else:
            text.append(f"{reward:g} ", style="green" if reward > 0 else "yellow")
    return text
