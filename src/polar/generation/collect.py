"""Finished sessions into ledger lines, as they arrive.

Each instance is one task of this run, with one session per missing attempt; a session's
``sample_index`` maps back to its attempt index through the task's plan. The collector reads
the rollout server through the typed client (one list of task summaries per poll, and a task's
results only when its finished count grew) and the engine's spend from the gateway's capture
store, stores each result, then appends its line to the ledger.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from polar.capture.store import CaptureStore
from polar.client import RolloutClient
from polar.generation.attempts import AttemptRecord, Ledger, Spend, attempt_record
from polar.schemas.task import SessionResult, SessionStatus


@dataclass
class TaskPlan:
    """One submitted task: an instance's missing attempts, in sample order."""

    task_id: str
    instance_id: str
    repo: str
    attempts: list[int]
    recorded: set[int] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return len(self.recorded) >= len(self.attempts)


class Collector:
    """Records every finished session of ``plans`` exactly once; ``on_record`` hears each."""

    def __init__(
        self,
        ledger: Ledger,
        plans: list[TaskPlan],
        *,
        run: int,
        keep_workspaces: bool = False,
        on_record: Callable[[AttemptRecord], None] | None = None,
    ) -> None:
        self.client: RolloutClient | None = None
        self.store: CaptureStore | None = None
        self.ledger = ledger
        self.plans = {plan.task_id: plan for plan in plans}
        self.run = run
        self.keep_workspaces = keep_workspaces
        self.on_record = on_record
        self.records: list[AttemptRecord] = []

    def connect(self, client: RolloutClient, store: CaptureStore) -> None:
        """Read from this rollout server and capture store (once the stack is up)."""
        self.client = client
        self.store = store

    @property
    def done(self) -> bool:
        return all(plan.done for plan in self.plans.values())

    def poll(self) -> None:
        """Read the tasks' counts; record the new results of tasks whose count grew."""
        assert self.client is not None, "collector not connected"
        for summary in self.client.tasks():
            plan = self.plans.get(summary.task_id)
            if plan is None or plan.done:
                continue
            plan.counts = dict(summary.counts)
            if summary.finished_sessions > len(plan.recorded):
                for result in self.client.result(plan.task_id).results:
                    self._record(plan, result)

    def _record(self, plan: TaskPlan, result: SessionResult) -> None:
        sample = result.sample_index
        if sample is None or sample in plan.recorded or sample >= len(plan.attempts):
            return
        attempt = plan.attempts[sample]
        stored = self.ledger.store_result(plan.instance_id, attempt, result)
        record = attempt_record(
            result,
            instance_id=plan.instance_id,
            attempt=attempt,
            repo=plan.repo,
            run=self.run,
            stored=stored,
            spend=self._spend(result.session_id),
        )
        self.ledger.append(record)
        plan.recorded.add(sample)
        self.records.append(record)
        if not self.keep_workspaces:
            prune_workspaces(result)
        if self.on_record is not None:
            self.on_record(record)

    def _spend(self, session_id: str) -> Spend:
        assert self.store is not None, "collector not connected"
        calls = self.store.summaries(session_id)
        return Spend(
            calls=len(calls),
            prompt_tokens=sum(int(c["n_prompt"] or 0) for c in calls),
            sampled_tokens=sum(int(c["n_sampled"] or 0) for c in calls),
        )

    def stage_counts(self) -> dict[str, dict[str, int]]:
        """Per repository: sessions queued and running now (from the last poll)."""
        out: dict[str, dict[str, int]] = {}
        for plan in self.plans.values():
            counts = out.setdefault(plan.repo, {"queued": 0, "running": 0})
            if plan.done:
                continue
            for status, n in plan.counts.items():
                if status == SessionStatus.REGISTERED:
                    counts["queued"] += n
                elif not SessionStatus(status).finished:
                    counts["running"] += n
            if not plan.counts:
                counts["queued"] += len(plan.attempts) - len(plan.recorded)
        return out


def prune_workspaces(result: SessionResult) -> None:
    """Delete a finished session's repository copies (its workspace and its evaluation's): a
    generation run makes one per attempt, and the patch is already in the result. Logs stay."""
    session_dir = result.session_dir
    if not session_dir:
        return
    base = Path(session_dir)
    for directory in (base, *base.parent.glob(f"{base.name}-eval*")):
        shutil.rmtree(directory / "workspace", ignore_errors=True)
