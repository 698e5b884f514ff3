"""What each lifecycle stage does for one session: runtime, harness, trajectory, evaluation.

INIT starts the task's runtime (its prepare steps run inside ``start``). RUN writes the harness
preset's files, runs its command with the session's environment, and closes the session's key
when the harness is done, so nothing arrives after the trajectory is built. POSTRUN builds the
trajectory from the capture store (a partial one, status TIMEOUT or ERROR, when the run ended
early), evaluates it while the runtime is still up, and tears the runtime down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from polar.capture.records import CaptureRecord
from polar.capture.store import CaptureStore
from polar.engines.base import Engine
from polar.errors import CaptureError, HarnessError, HarnessTimeout
from polar.evaluators.base import EvaluationContext, EvaluationResult
from polar.evaluators.registry import create_evaluator
from polar.gateway.config import GatewayConfig, NodeConfig
from polar.gateway.node.call_budget import until_calls_spent
from polar.gateway.node.executors import evaluator_threads
from polar.gateway.node.lifecycle import NodeSession, RunOutcome
from polar.gateway.sessions import GatewaySession, SessionRegistry, SessionTags, session_url
from polar.harnesses.base import HarnessContext
from polar.harnesses.install import default_prefix
from polar.harnesses.registry import harness_for
from polar.harnesses.runner import run_launch
from polar.providers.registry import routing_table
from polar.runtimes.base import AsgiApp, Runtime
from polar.runtimes.registry import create_runtime
from polar.schemas.ids import path_segment
from polar.schemas.task import (
    EvaluationSummary,
    SessionFailure,
    SessionResult,
    SessionStatus,
    TaskRequest,
)
from polar.schemas.trajectory import Trajectory, TrajectoryStatus
from polar.trajectory.registry import create_builder
from polar.turn_rewards.registry import create_turn_reward
from polar.turn_rewards.scoring import attach_turn_rewards, score_session

log = logging.getLogger("polar.gateway.session")

LIFTED_METADATA = ("group_id", "policy_version", "rollout_step")
EVALUATOR_FAILED = SessionFailure(kind="evaluator", reason="evaluator_failed")


@dataclass
class NodeContext:
    """What every session on a node shares."""

    gateway: GatewayConfig
    node: NodeConfig
    store: CaptureStore
    sessions: SessionRegistry
    policy_version: Callable[[], int]
    model_api: Callable[[str], AsgiApp] | None = None
    """The session's model-API view for its runtimes (the sandbox reaches that, nothing else)."""
    engine: Engine | None = None
    """The gateway's engine, for turn-reward hooks that ask a model (llm_judge)."""


def session_env(runtime: Runtime, session_id: str, task_id: str) -> dict[str, str]:
    """The environment every harness gets: every provider's SDK pointed at this session."""
    root = session_url(runtime.gateway_url_inside, session_id)
    polar_dir = f"{runtime.home.rstrip('/')}/.polar"
    return {
        **routing_table().sdk_env(root, session_id),
        "POLAR_SESSION_ID": session_id,
        "SESSION_ID": session_id,
        "TASK_ID": task_id,
        "POLAR_SESSION_DIR": polar_dir,
        "POLAR_ARTIFACT_DIR": f"{polar_dir}/artifacts",
        "POLAR_LOG_DIR": f"{polar_dir}/logs",
    }


class RolloutWork:
    """The stage bodies of one session (the ``SessionWork`` the lifecycle drives)."""

    def __init__(self, session: NodeSession, ctx: NodeContext) -> None:
        self.session = session
        self.ctx = ctx
        self.task: TaskRequest = session.dispatch.task
        self.session_dir = ctx.node.work_dir / path_segment(session.session_id)
        self.runtime: Runtime | None = None
        self.fresh: Runtime | None = None
        self._prewarm: asyncio.Task[None] | None = None
        self.exit_code: int | None = None
        self.built: Trajectory | None = None
        self._calls: GatewaySession | None = None

    # -- INIT ------------------------------------------------------------------------------

    async def init(self) -> None:
        self.runtime = self._new_runtime(self.session_dir)
        await self.runtime.start()

    # -- RUN -------------------------------------------------------------------------------

    async def run(self, budget_s: float) -> None:
        runtime = self.runtime
        assert runtime is not None
        if self.task.evaluator.refresh_runtime:
            self._prewarm = asyncio.create_task(self._start_fresh())
        agent = self.task.agent
        name = agent.import_path or agent.harness or "harness"
        try:
            env = session_env(runtime, self.session.session_id, self.task.task_id)
            # The directories the environment names, under HOME (writable in every runtime).
            await runtime.make_dirs(env["POLAR_ARTIFACT_DIR"], env["POLAR_LOG_DIR"])
            launch = harness_for(agent).prepare(self._harness_context(runtime))
            launch = replace(launch, env={**env, **launch.env})
            self._calls = self.ctx.sessions.get(self.session.session_id)
            # A budget that pauses for model calls is enforced by the lifecycle alone.
            timeout_s = budget_s if self.task.timeout_counts_model_time else None
            outcome = await until_calls_spent(
                run_launch(launch, runtime, timeout_s=timeout_s, harness=name), self._calls
            )
            self.exit_code = outcome.exit_code
        except HarnessTimeout as exc:
            self.exit_code = exc.exit_code
            raise TimeoutError(str(exc)) from exc
        except HarnessError as exc:
            self.exit_code = exc.exit_code
            raise
        finally:
            # The session's key stops working, now and after a restart: the trajectory is
            # built from a closed record.
            await self.ctx.sessions.close(self.session.session_id)

    def model_seconds(self) -> float:
        """How long the session's model calls have been with the gateway during RUN."""
        return self._calls.model_seconds() if self._calls is not None else 0.0

    def _harness_context(self, runtime: Runtime) -> HarnessContext:
        agent = self.task.agent
        return HarnessContext(
            session_id=self.session.session_id,
            gateway_url=runtime.gateway_url_inside,
            model_name=agent.model_name,
            instruction=self.task.instruction,
            workdir=runtime.workdir,
            home=runtime.home,
            prefix=str(default_prefix()),
            settings=agent.settings,
            env=agent.env,
        )

    # -- POSTRUN ---------------------------------------------------------------------------

    async def postrun(self, outcome: RunOutcome) -> SessionResult:
        session = self.session
        status, error, failure = outcome.status, outcome.error, outcome.failure
        trajectory: Trajectory | None = None
        evaluation: EvaluationResult | None = None
        try:
            session.set_status(SessionStatus.BUILDING)
            trajectory = self.built = await self._build(status)
            if trajectory is not None and self._can_evaluate(outcome):
                session.set_status(SessionStatus.EVALUATING)
                try:
                    evaluation = await self._evaluate(trajectory)
                except Exception as exc:
                    status, error = SessionStatus.ERROR, f"evaluator failed: {exc!r}"
                    failure = EVALUATOR_FAILED
                    session.log(
                        "session.evaluator_failed",
                        f"evaluator failed for {session.session_id}: {exc!r}",
                        level=logging.WARNING,
                        logger=log,
                        error=error,
                    )
                else:
                    session.log(
                        "session.evaluated",
                        f"session {session.session_id} evaluated: reward {evaluation.reward:g}",
                        logger=log,
                        reward=evaluation.reward,
                        passed=evaluation.passed,
                    )
        finally:
            await self.abort()
        if evaluation is not None and trajectory is not None:
            trajectory = _with_reward(trajectory, evaluation.reward)
        return SessionResult(
            session_id=session.session_id,
            task_id=self.task.task_id,
            status=status,
            trajectory=trajectory,
            reward=evaluation.reward if evaluation else None,
            node_id=session.node_id,
            error=error,
            failure=failure,
            sample_index=self.session.dispatch.sample_index,
            exit_code=self.exit_code,
            session_dir=str(self.session_dir) if self._host_files() else None,
            evaluation=_summary(evaluation),
        )

    def _host_files(self) -> bool:
        """Whether the session's files are on this host (not a pod's or a service's)."""
        return self.runtime is None or self.runtime.host_files

    def _can_evaluate(self, outcome: RunOutcome) -> bool:
        return outcome.reached_run and not outcome.cancelled and self.runtime is not None

    async def _build(self, status: SessionStatus) -> Trajectory | None:
        """The trajectory from every captured call; None when the harness never ran."""
        session_id = self.session.session_id
        records = await asyncio.to_thread(self.ctx.store.records, session_id)
        if not records and not self.session.outcome.reached_run:
            return None
        builder = create_builder(self.task.builder.strategy, self.task.builder.config)
        trajectory = await asyncio.to_thread(
            builder.build,
            records,
            status=_trajectory_status(status),
            metadata=self._trajectory_metadata(),
        )
        if self.task.turn_rewards:
            await self._score_turns(trajectory, records)
        return trajectory

    async def _score_turns(self, trajectory: Trajectory, records: list[CaptureRecord]) -> None:
        """The task's turn-reward hooks' scores, on the traces' sampled tokens."""
        hooks = [create_turn_reward(spec, self.ctx.engine) for spec in self.task.turn_rewards]
        try:
            scores = await score_session(hooks, records)
        finally:
            for hook in hooks:
                await hook.aclose()
        attach_turn_rewards(trajectory, scores)

    async def _evaluate(self, trajectory: Trajectory) -> EvaluationResult:
        runtime = self.runtime
        assert runtime is not None
        # Off the loop: building one may import a heavy grader (swebench) the first time.
        evaluator = await asyncio.to_thread(create_evaluator, self.task.evaluator)
        if self._prewarm is not None:
            await asyncio.wait({self._prewarm})
        ctx = EvaluationContext(
            runtime=runtime,
            trajectory=trajectory,
            task=self.task,
            workspace=await runtime.workspace_snapshot(),
            fresh_runtime=self._fresh_runtime,
        )
        with evaluator_threads():  # its to_thread work on the node's evaluator pool
            return await evaluator.evaluate(ctx)

    async def _start_fresh(self) -> None:
        """Pre-warm the evaluator's fresh runtime while the harness runs."""
        self.fresh = self._new_fresh()
        try:
            await self.fresh.start()
        except Exception as exc:
            self.session.log(
                "session.prewarm_failed",
                f"pre-warming the evaluation runtime failed: {exc!r}",
                logger=log,
                error=repr(exc),
            )
            self.fresh = None

    def _fresh_runtime(self) -> Runtime:
        """The pre-warmed runtime the first time (already started), then new unstarted ones."""
        fresh, self.fresh = self.fresh, None
        return fresh if fresh is not None else self._new_fresh()

    def _new_fresh(self) -> Runtime:
        index = len(list(self.session_dir.parent.glob(f"{self.session_dir.name}-eval*")))
        path = self.session_dir.with_name(f"{self.session_dir.name}-eval{index}")
        return self._new_runtime(path)

    def _new_runtime(self, session_dir: Path) -> Runtime:
        """A runtime for this session whose sandbox reaches only the session's model API."""
        view = self.ctx.model_api(self.session.session_id) if self.ctx.model_api else None
        return create_runtime(self.task.runtime, session_dir, self._gateway_url(), model_api=view)

    async def abort(self) -> None:
        """Stop everything this session started (the runtime, a pre-warmed one), and close its
        key if RUN did not (it never ran, or was cancelled)."""
        await self._close_key()
        if self._prewarm is not None and not self._prewarm.done():
            self._prewarm.cancel()
            await asyncio.wait({self._prewarm})
        for runtime in (self.runtime, self.fresh):
            if runtime is not None:
                with contextlib.suppress(Exception):
                    await runtime.stop()

    async def _close_key(self) -> None:
        """Close the session's key unless RUN did. Its key stops working at once; a store that
        cannot write the close now is only logged: the node closes every session still open
        in its store when it starts again, and the teardown must go on."""
        session_id = self.session.session_id
        if self.ctx.sessions.is_closed(session_id):
            return
        try:
            await self.ctx.sessions.close(session_id)
        except CaptureError as exc:
            self.session.log(
                "session.close_failed",
                f"closing {session_id} in the capture store failed: {exc}",
                level=logging.WARNING,
                logger=log,
                error=repr(exc),
            )

    # -- metadata --------------------------------------------------------------------------

    def _trajectory_metadata(self) -> dict[str, Any]:
        meta = {k: self.task.metadata[k] for k in LIFTED_METADATA if k in self.task.metadata}
        meta.setdefault("policy_version", self.ctx.policy_version())
        return {
            **meta,
            "session_id": self.session.session_id,
            "task_id": self.task.task_id,
            "sample_index": self.session.dispatch.sample_index,
            "node_id": self.session.node_id,
            "harness": self.task.agent.harness or self.task.agent.import_path,
        }

    def _gateway_url(self) -> str:
        return self.ctx.gateway.base_url()


async def open_session(ctx: NodeContext, session: NodeSession) -> None:
    """Make an admitted session's key valid on this gateway (durably, before the dispatch is
    acked), tagged with what the gateway reads of it."""
    dispatch = session.dispatch
    tags = SessionTags(
        task_id=dispatch.task.task_id,
        sample_index=dispatch.sample_index,
        node_id=session.node_id,
        max_model_calls=dispatch.task.agent.max_model_calls,
    )
    await ctx.sessions.open(session.session_id, tags)


def _summary(evaluation: EvaluationResult | None) -> EvaluationSummary | None:
    if evaluation is None:
        return None
    return EvaluationSummary(verdict=evaluation.passed, details=evaluation.details)


def _trajectory_status(status: SessionStatus) -> TrajectoryStatus:
    if status == SessionStatus.TIMEOUT:
        return TrajectoryStatus.TIMEOUT
    if status == SessionStatus.COMPLETED:
        return TrajectoryStatus.COMPLETED
    return TrajectoryStatus.ERROR


def _with_reward(trajectory: Trajectory, reward: float) -> Trajectory:
    traces = [t.model_copy(update={"reward": reward}) for t in trajectory.traces]
    return trajectory.model_copy(update={"traces": traces})
