"""verl bridge: an agent loop whose outputs come from a Polar session.

verl's agent-loop rollout calls ``run(sampling_params, **kwargs)`` once per sample (it repeats
each prompt ``rollout.n`` times and groups them itself for GRPO). The Polar agent loop submits
one task with one session for it, waits, and returns the session's main trace as an
``AgentLoopOutput`` via the verl exporter: ``prompt_ids``, ``response_ids``, ``response_mask``
(1 on sampled tokens), ``response_logprobs``, ``reward_score`` (the evaluator's; verl uses it
instead of running its own reward function), ``num_turns``, and Polar's session facts under
``extra_fields["polar"]``.

verl pads responses to ``rollout.response_length``: a longer response is cut there (mask and
logprobs with it) and flagged ``extra_fields["polar"]["truncated"]``; a prompt longer than
``rollout.prompt_length`` is an error (raise the limit; cutting a prompt would train on a
context the model never saw). A failed session (``zero_advantage``) keeps its tokens with an
all-zero mask and reward 0, so it teaches nothing; verl's group baseline still counts that 0.

verl groups the samples itself after the loop returns, so a sample cannot leave its group.
With ``drop_infra_failures`` (the default) a session the infrastructure failed (failure kind
``infra``: node lost, runtime failed to start, cancelled) is run again as a fresh task, up to
``infra_retries`` times, so its slot holds a real sample rather than a 0 that says nothing about
the policy; if every try fails that way the failed row stands, and
``extra_fields["polar"]["failure_kind"]`` says so.

verl runs its agent loops in its own ``AgentLoopWorker`` processes (Ray actors), which load custom
loops from the YAML file ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` names: an
entry ``_target_: polar.training.bridges.verl.PolarVerlAgentLoop`` with ``rollout_url`` and
``task_factory`` (``module:function``, a dataset row in, a TaskRequest out) selects this loop,
and every sample whose ``agent_name`` is that entry's ``name`` runs through it (see
docs/training.md). :class:`PolarVerlAgentLoop` reads ``prompt_length`` and ``response_length``
from verl's rollout config. :func:`register_agent_loop` registers a loop built by a callable
instead, for an ``AgentLoopWorker`` in the calling process. Both need verl; point the Polar
gateway nodes' engine at verl's rollout servers.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import itertools
import time
import uuid
from collections.abc import Callable
from typing import Any

from polar.client import RolloutClient
from polar.schemas.task import TaskRequest
from polar.training.bridges.sessions import BridgeFailurePolicy, session_rows, untrainable
from polar.trajectory.exporters.verl import VerlExporter

LoopTaskFactory = Callable[[dict[str, Any]], TaskRequest]


class PolarAgentLoop:
    """The bridge's logic, free of verl: ``await loop.run(sampling_params, **kwargs)``."""

    def __init__(
        self,
        rollout_url: str,
        make_task: LoopTaskFactory,
        *,
        token: str | None = None,
        prompt_length: int | None = None,
        response_length: int | None = None,
        timeout_s: float = 3600.0,
        on_failure: BridgeFailurePolicy = "zero_advantage",
        drop_infra_failures: bool = True,
        infra_retries: int = 2,
        client: RolloutClient | None = None,
    ) -> None:
        self.client = client or RolloutClient(rollout_url, token=token)
        self.make_task = make_task
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.timeout_s = timeout_s
        self.on_failure = on_failure
        self.drop_infra_failures = drop_infra_failures
        self.infra_retries = max(0, infra_retries)
        self.exporter = VerlExporter()
        self.run_id = uuid.uuid4().hex[:8]
        self._counter = itertools.count()

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """AgentLoopOutput fields for one sample; ``kwargs`` are the dataset row verl passes
        (``raw_prompt``, ``extra_info``, ...), handed to ``make_task``."""
        started = time.perf_counter()
        made = self.make_task(kwargs)
        allowed = self.infra_retries if self.drop_infra_failures else 0
        retries = 0
        while True:
            task_id = f"verl-{self.run_id}-{next(self._counter)}-{made.task_id}"
            task = made.model_copy(
                update={
                    "task_id": task_id,
                    "num_samples": 1,
                    "metadata": {**made.metadata, "group_id": task_id},
                }
            )
            [result] = await asyncio.to_thread(self.client.run, [task], self.timeout_s)
            [row] = session_rows(
                result,
                expected=1,
                on_failure=self.on_failure,
                drop_infra_failures=self.drop_infra_failures,
            )
            if not (row.failed and row.infra_failure) or retries >= allowed:
                break
            retries += 1
        if row.trace is None:
            raise RuntimeError(
                f"Polar session {row.result.session_id} produced no trace "
                f"({row.result.status.value}: {row.result.error}); verl needs tokens for every "
                "sample"
            )
        trace = row.trace if row.trainable else untrainable(row.trace)
        out = self.exporter.row(trace, row.session)
        if self.prompt_length is not None and len(out["prompt_ids"]) > self.prompt_length:
            raise ValueError(
                f"prompt of {len(out['prompt_ids'])} tokens exceeds rollout.prompt_length "
                f"{self.prompt_length}; raise it"
            )
        truncated = False
        limit = self.response_length
        if limit is not None and len(out["response_ids"]) > limit:
            truncated = True
            for key in ("response_ids", "response_mask", "response_logprobs"):
                if out[key] is not None:
                    out[key] = out[key][:limit]
            if out["routed_experts"] is not None:  # one position per token but the last
                out["routed_experts"] = out["routed_experts"][: len(out["prompt_ids"]) + limit - 1]
        polar = out.pop("extra_fields")
        polar.update(
            left_out_traces=row.left_out_traces, truncated=truncated, infra_retries=retries
        )
        if row.result.failure is not None:
            polar["failure_kind"] = row.result.failure.kind
        out["reward_score"] = row.reward if row.reward is not None else 0.0
        out["extra_fields"] = {"polar": polar}
        out["metrics"] = {
            "generate_sequences": time.perf_counter() - started,
            "tool_calls": 0.0,
        }
        return out


LoopFactory = Callable[[], PolarAgentLoop]

# One PolarAgentLoop (and so one rollout client) per process and settings: verl builds a new
# agent-loop object for every sample.
_loops: dict[tuple[Any, ...], PolarAgentLoop] = {}
_factories: dict[str, LoopFactory] = {}


def register_agent_loop(name: str, make_loop: LoopFactory) -> type:
    """Register ``name`` in verl's agent-loop registry of this process as a
    :class:`PolarVerlAgentLoop` whose loop ``make_loop()`` builds (once). Requires verl."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    cls = _verl_agent_loop_class()
    _factories[name] = make_loop
    _agent_loop_registry[name] = {
        "_target_": f"{cls.__module__}.{cls.__qualname__}",
        "polar_loop": name,
    }
    return cls


def _import_factory(spec: str) -> LoopTaskFactory:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"task_factory {spec!r} is not 'module:function'")
    factory: LoopTaskFactory = getattr(importlib.import_module(module_name), attr)
    return factory


def _shared_loop(
    polar_loop: str | None, settings: dict[str, Any], prompt_length: int, response_length: int
) -> PolarAgentLoop:
    key = (polar_loop, tuple(sorted(settings.items())), prompt_length, response_length)
    loop = _loops.get(key)
    if loop is not None:
        return loop
    if polar_loop is not None:
        if polar_loop not in _factories:
            raise KeyError(f"no Polar agent loop registered as {polar_loop!r} in this process")
        loop = _factories[polar_loop]()
    else:
        options = dict(settings)
        url, factory = options.pop("rollout_url", None), options.pop("task_factory", None)
        if not url or not factory:
            raise ValueError(
                "the agent loop config entry of PolarVerlAgentLoop needs rollout_url and "
                "task_factory ('module:function')"
            )
        loop = PolarAgentLoop(
            str(url),
            _import_factory(str(factory)),
            prompt_length=prompt_length,
            response_length=response_length,
            **options,
        )
    _loops[key] = loop
    return loop


@functools.cache
def _verl_agent_loop_class() -> type:
    """verl's ``AgentLoopBase`` subclass, built on first use so that importing this module does
    not import verl; hydra locates it as ``polar.training.bridges.verl.PolarVerlAgentLoop``."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

    class PolarVerlAgentLoop(AgentLoopBase):
        def __init__(
            self,
            *args: Any,
            polar_loop: str | None = None,
            rollout_url: str | None = None,
            task_factory: str | None = None,
            token: str | None = None,
            timeout_s: float = 3600.0,
            on_failure: BridgeFailurePolicy = "zero_advantage",
            drop_infra_failures: bool = True,
            infra_retries: int = 2,
            name: str | None = None,  # the config entry's own name, which verl passes on
            **kwargs: Any,
        ) -> None:
            super().__init__(*args, **kwargs)
            settings: dict[str, Any] = {
                "rollout_url": rollout_url,
                "task_factory": task_factory,
                "timeout_s": float(timeout_s),
                "on_failure": on_failure,
                "drop_infra_failures": bool(drop_infra_failures),
                "infra_retries": int(infra_retries),
            }
            if token is not None:
                settings["token"] = token
            self.polar = _shared_loop(
                polar_loop,
                settings,
                int(self.rollout_config.prompt_length),
                int(self.rollout_config.response_length),
            )

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            return AgentLoopOutput(**await self.polar.run(sampling_params, **kwargs))

    PolarVerlAgentLoop.__module__ = __name__
    PolarVerlAgentLoop.__qualname__ = PolarVerlAgentLoop.__name__
    return PolarVerlAgentLoop


def __getattr__(name: str) -> Any:
    if name == "PolarVerlAgentLoop":
        return _verl_agent_loop_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
