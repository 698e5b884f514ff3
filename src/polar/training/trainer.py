"""The embedded GRPO trainer: rollouts through Polar, updates of the very model being served.

One process holds one model object. The embedded engine serves it to a gateway node, which a
rollout server feeds with sessions; harnesses run as real processes in their runtimes and call
the gateway over loopback. Each step:

0. (optional, once) a warm start: scripted demonstrations of training tasks through their own
   harness, then SFT on the accepted ones (:mod:`polar.training.sft`);
1. submit ``tasks.per_step`` tasks of ``tasks.num_samples`` sessions and wait for them;
2. compute group advantages and loss weights (:mod:`polar.training.advantages`,
   :func:`polar.training.losses.loss_weights`);
3. pause the gateway and the engine, run the clipped policy-gradient update on the served
   module, bump the policy version (the engine stamps it on every later completion), resume.

Rollouts are therefore exactly on-policy and weight sync costs nothing. The engine's logprobs
are the behaviour policy; the first forward pass of each update also measures how far the
trainer's recomputation is from them (``logprob_mismatch``), which should stay near float
precision.
"""

from __future__ import annotations

import copy
import logging
import math
import random
import shutil
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import torch

from polar.client import RolloutClient
from polar.engines.embedded import EmbeddedEngineCore, LoadedModel, load_model
from polar.errors import ConfigError
from polar.schemas.sampling import SamplingPolicy
from polar.schemas.task import SessionResult, TaskRequest
from polar.schemas.token_delivery import TokenDelivery
from polar.schemas.trajectory import TraceStats
from polar.stack.local import LocalStack
from polar.training import allocator
from polar.training.advantages import ScoredTrace, compute_advantages, samples_from_results
from polar.training.batch import make_batch, response_logprobs
from polar.training.checkpointing import checkpointed
from polar.training.checkpoints import (
    TrainerState,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from polar.training.gateway_control import GatewayControl
from polar.training.losses import clipped_policy_loss, loss_weights
from polar.training.metrics import MetricsLog, plot_rewards, staleness
from polar.training.sft import SFT_FILE, demonstrate, fine_tune
from polar.training.staleness import mask_stale_samples
from polar.training.tasks import task_source
from polar.training.trainer_config import TrainConfig
from polar.training.turn_credit import turn_reward_report

log = logging.getLogger("polar.training")


class EmbeddedTrainer:
    """``run()`` trains for ``config.steps`` steps (resuming from the latest checkpoint)."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        loaded: LoadedModel | None = None,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.echo = echo or log.info
        allocator.use_arenas(config.memory.arenas)  # before the engine's threads: they keep one
        if config.threads:
            torch.set_num_threads(config.threads)
        torch.manual_seed(config.seed)
        if config.sampling.temperature < 1e-5 or config.sampling.top_p != 1.0:
            raise ConfigError(
                "training needs sampling.temperature > 0 and top_p 1 (the trainer must be able "
                "to recompute the distribution the engine sampled from)"
            )
        self.temperature = config.sampling.temperature
        self.core = EmbeddedEngineCore(
            loaded or load_model(config.model, dtype=config.dtype),
            max_active=config.run_workers,
            # the behaviour policy is the tempered distribution the tokens were drawn from
            logprobs_mode="raw" if self.temperature == 1.0 else "processed",
            kv_cache_bytes=config.kv_cache_mb << 20,
        )
        self.module = self.core.module  # the one model: served and trained
        self.module.eval()  # no dropout: the trainer's forward is the engine's forward
        self.optimizer = torch.optim.AdamW(
            [p for p in self.module.parameters() if p.requires_grad],
            lr=config.optim.lr,
            betas=config.optim.betas,
            weight_decay=config.optim.weight_decay,
        )
        self.reference = None
        if config.algorithm.loss.kl_coef > 0:
            self.reference = copy.deepcopy(self.module).requires_grad_(False)
        self.source = task_source(config.tasks.source)
        self.out = config.output_dir
        self.step = 0
        self.rng = random.Random(config.seed)
        self.metrics: MetricsLog | None = None

    # -- the run ---------------------------------------------------------------------------

    def run(self, *, resume: bool = True) -> dict[str, Any]:
        """Train; returns the last step's metrics and the evaluations (if configured)."""
        cfg = self.config
        self.out.mkdir(parents=True, exist_ok=True)
        self.metrics = MetricsLog(self.out, tensorboard=cfg.tensorboard)
        if resume:
            self._resume()
        self.metrics.truncate(self.step)
        work = self.out / "polar"
        shutil.rmtree(work, ignore_errors=True)  # rollout state of an earlier run
        sampling = SamplingPolicy(
            temperature=cfg.sampling.temperature,
            top_p=cfg.sampling.top_p,
            max_tokens=cfg.sampling.max_tokens,
        )
        summary: dict[str, Any] = {"evals": []}
        stack = LocalStack.embedded(
            self.core, work, sampling=sampling, runtime=cfg.runtime, run_workers=cfg.run_workers
        )
        try:
            with stack, RolloutClient(stack.rollout_url, token=stack.rollout_token) as client:
                control = GatewayControl([stack.gateway_url], token=stack.gateway_token)
                try:
                    if cfg.eval.tasks and self.step == 0:  # a resumed run has its "before"
                        summary["evals"].append(self.evaluate(client, stack))
                    if cfg.sft.tasks and self.step == 0:
                        summary["sft"] = self.warm_start(control)
                        if cfg.eval.tasks:
                            summary["evals"].append(self.evaluate(client, stack, phase="sft"))
                    while self.step < cfg.steps:
                        summary["last"] = self.train_step(client, control)
                        if cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0:
                            self.save()
                        if self._eval_due():
                            summary["evals"].append(self.evaluate(client, stack))
                    self.save()
                    if cfg.eval.tasks and self.step > 0:
                        summary["evals"].append(self.evaluate(client, stack))
                finally:
                    control.close()
        finally:
            self.metrics.close()
            self.core.close()
        plot = plot_rewards(self.out)
        summary["plot"] = str(plot) if plot else None
        return summary

    @contextmanager
    def _training(self, control: GatewayControl) -> Iterator[None]:
        """The engine paused and the gateways told, for a change of the served weights."""
        kib = self.config.memory.train_mmap_threshold_kib
        with (
            control.weight_update(self.core.policy_version + 1),
            self.core.weights_update(),
            allocator.training_phase(None if kib is None else kib << 10),
        ):
            yield

    def _phase_done(self) -> dict[str, int]:
        """After a phase: its freed memory goes back to the system (if configured); the
        resident and peak memory then, for the phase's record."""
        if self.config.memory.trim_between_phases:
            allocator.release_freed()
        return allocator.memory_mib()

    def _eval_due(self) -> bool:
        """Between steps, every ``eval.every`` (the last step is evaluated after the loop)."""
        every = self.config.eval.every
        return bool(
            self.config.eval.tasks
            and every
            and self.step % every == 0
            and self.step < self.config.steps
        )

    def train_step(self, client: RolloutClient, control: GatewayControl) -> dict[str, Any]:
        cfg = self.config
        started = time.perf_counter()
        tasks = self._tasks("train", self.step + 1, cfg.tasks.per_step, cfg.tasks.num_samples)
        results = [r for t in client.run(tasks, cfg.tasks.timeout_s) for r in t.results]
        return self.train_on(results, control, started=started)

    def train_on(
        self,
        results: Sequence[SessionResult],
        control: GatewayControl,
        *,
        started: float | None = None,
    ) -> dict[str, Any]:
        """One update on finished sessions: this step's, or sessions that kept running across
        earlier updates (their calls carry older policy versions). Staleness is judged here,
        at consumption: ``algorithm.max_staleness`` masks every call too far behind the
        trainer's version now (:mod:`polar.training.staleness`), on top of what the builder
        masked, and ``staleness`` reports the lag at consumption."""
        cfg = self.config
        rolled = time.perf_counter()
        started = rolled if started is None else started
        step = self.step + 1
        samples, consumed = mask_stale_samples(
            samples_from_results(results),
            self.core.policy_version,
            cfg.algorithm.max_staleness,
        )
        scored, report = compute_advantages(samples, cfg.algorithm.advantage)
        weights = loss_weights(scored, cfg.algorithm.loss.normalisation)
        lag = staleness((s.trace for s in scored), self.core.policy_version, consumed)
        with self._training(control):
            update = self._update(scored, weights)
        self.step = step
        record = {
            "step": step,
            "policy_version": self.core.policy_version,
            **_outcomes(results),
            "staleness": lag,
            "turn_rewards": turn_reward_report(results),
            **update,
            "advantages": report.as_dict(),
            "rollout_s": rolled - started,
            "update_s": time.perf_counter() - rolled,
            "step_s": time.perf_counter() - started,
            "memory": self._phase_done(),
        }
        assert self.metrics is not None
        self.metrics.train(record)
        self.echo(
            f"step {step}: reward {record['reward_mean']:.3f} ± {record['reward_std']:.3f}, "
            f"pass {record['pass_rate']:.2f}, clip {record['clip_fraction']:.3f}, "
            f"{record['step_s']:.1f}s"
        )
        return record

    def warm_start(self, control: GatewayControl) -> dict[str, Any]:
        """Scripted demonstrations of training tasks through their harness, then SFT of the
        served model on the accepted ones (one policy version)."""
        cfg = self.config
        started = time.perf_counter()
        tasks = self._tasks(
            "sft",
            0,
            cfg.sft.tasks,
            cfg.sft.demonstrations,
            source_split="train",
            options=cfg.sft.options,
        )
        rows, results = demonstrate(
            tasks,
            self.out / "demonstrations",
            tokenizer=self.core.tokenizer,
            model_name=self.core.model_name,
            context_window=self.core.max_model_len,
            runtime=cfg.runtime,
            run_workers=cfg.run_workers,
            timeout_s=cfg.tasks.timeout_s,
        )
        (self.out / SFT_FILE).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        demonstrated = time.perf_counter()
        epochs: list[dict[str, Any]] = []
        if rows:
            with self._training(control):
                epochs = fine_tune(
                    self.module,
                    rows,
                    epochs=cfg.sft.epochs,
                    lr=cfg.sft.lr,
                    micro_batch_size=cfg.sft.micro_batch_size,
                    forward_rows=cfg.sft.forward_rows,
                    gradient_checkpointing=cfg.sft.gradient_checkpointing,
                    grad_clip=cfg.optim.grad_clip,
                    pad_id=int(self.core.tokenizer.pad_token_id or 0),
                    seed=cfg.seed,
                )
        record = {
            "step": 0,
            "policy_version": self.core.policy_version,
            **_outcomes(results),
            "rows": len(rows),
            "epochs": epochs,
            "demonstrate_s": demonstrated - started,
            "sft_s": time.perf_counter() - demonstrated,
            "memory": self._phase_done(),
        }
        assert self.metrics is not None
        self.metrics.sft(record)
        loss = f", loss {epochs[0]['loss']:.3f} -> {epochs[-1]['loss']:.3f}" if epochs else ""
        self.echo(
            f"warm start: {record['rows']} demonstration rows from {record['sessions']} sessions "
            f"(pass {record['pass_rate']:.2f}, {record['calls_per_trace']:.1f} calls per trace)"
            f"{loss}"
        )
        return record

    def evaluate(
        self, client: RolloutClient, stack: LocalStack, phase: str | None = None
    ) -> dict[str, Any]:
        """Held-out tasks (the same ones every time), at the eval temperature; ``phase``
        labels an evaluation that is not simply "at this step" (``sft``: after the warm start)."""
        cfg = self.config
        started = time.perf_counter()
        tag = f"s{self.step}" + (f"-{phase}" if phase else "")  # task ids are unique per run
        tasks = self._tasks("eval", 0, cfg.eval.tasks, cfg.eval.num_samples, tag=tag)
        policy = stack.sampling_policy
        saved = policy.temperature
        if cfg.eval.temperature is not None:
            policy.temperature = cfg.eval.temperature
        total = sum(t.num_samples for t in tasks)
        try:
            done = client.run(tasks, cfg.tasks.timeout_s, _every(15.0, self._eval_progress(total)))
            results = [r for t in done for r in t.results]
        finally:
            policy.temperature = saved
        kinds = {t.task_id: t.metadata.get("kind") for t in tasks}
        record = {
            "step": self.step,
            **({"phase": phase} if phase else {}),
            "policy_version": self.core.policy_version,
            **_outcomes(results),
            **_by_kind(results, kinds),
            "turn_rewards": turn_reward_report(results),
            "eval_s": time.perf_counter() - started,
            "examples": _examples(results, 4),
            "memory": self._phase_done(),
        }
        assert self.metrics is not None
        self.metrics.eval(record)
        per_kind = "".join(f" · {k} {v:.2f}" for k, v in record.get("by_kind", {}).items())
        self.echo(
            f"eval at step {self.step}: pass {record['pass_rate']:.3f} ({record['sessions']})"
            + per_kind
        )
        return record

    def _eval_progress(self, total: int) -> Callable[[int], None]:
        def show(finished: int) -> None:
            if finished < total:
                self.echo(f"eval at step {self.step}: {finished}/{total} sessions done")

        return show

    # -- the update ------------------------------------------------------------------------

    def _update(self, scored: Sequence[ScoredTrace], weights: Sequence[float]) -> dict[str, Any]:
        """Clipped PG over the batch, on the served module (the engine is paused)."""
        cfg = self.config
        loss_cfg = cfg.algorithm.loss
        pairs = [(s, w) for s, w in zip(scored, weights, strict=True) if w > 0]
        totals: Counter[str] = Counter()
        sums: dict[str, float] = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip": 0.0}
        mismatch: list[float] = []
        grad_norms: list[float] = []
        pairs = self._fill_behaviour(pairs)
        pad = int(self.core.tokenizer.pad_token_id or 0)
        first = True
        with checkpointed(self.module, cfg.optim.gradient_checkpointing):
            for _ in range(cfg.optim.epochs):
                order = list(pairs)
                self.rng.shuffle(order)
                for chunk in _split(order, cfg.optim.minibatches):
                    total = sum(w * s.trainable_tokens for s, w in chunk)
                    # Zero-advantage traces add nothing without a KL term: skip their forward.
                    live = [
                        (s, w / total)
                        for s, w in chunk
                        if s.advantage != 0.0 or s.token_bonus or self.reference is not None
                    ]
                    if not live:
                        continue
                    self.optimizer.zero_grad(set_to_none=True)
                    for micro in _chunks(live, cfg.optim.micro_batch_size):
                        batch = make_batch([s for s, _ in micro], [w for _, w in micro], pad)
                        logp = response_logprobs(self.module, batch, self.temperature)
                        ref = None
                        if self.reference is not None:
                            with torch.no_grad():
                                ref = response_logprobs(self.reference, batch, self.temperature)
                        terms = clipped_policy_loss(
                            logp,
                            batch.rollout_logprobs,
                            batch.advantages,
                            batch.weights,
                            batch.loss_mask,
                            clip_low=loss_cfg.clip_low,
                            clip_high=loss_cfg.clip_high,
                            ref_logprobs=ref,
                            kl_coef=loss_cfg.kl_coef,
                        )
                        terms.loss.backward()
                        if first:
                            keep = batch.loss_mask.bool()
                            diff = (logp.detach() - batch.rollout_logprobs).abs()[keep]
                            mismatch.extend(diff.tolist())
                        sums["loss"] += float(terms.loss.detach())
                        sums["pg_loss"] += terms.pg_loss
                        sums["kl"] += terms.kl * terms.tokens
                        sums["clip"] += terms.clip_fraction * terms.tokens
                        totals["tokens"] += terms.tokens
                        totals["forwards"] += 1
                    norm = torch.nn.utils.clip_grad_norm_(
                        self.module.parameters(), cfg.optim.grad_clip
                    )
                    grad_norms.append(float(norm))
                    self.optimizer.step()
                    totals["optimizer_steps"] += 1
                    first = False
        self.optimizer.zero_grad(set_to_none=True)
        tokens = max(totals["tokens"], 1)
        return {
            "traces": len(scored),
            "trainable_tokens": sum(s.trainable_tokens for s in scored),
            "total_tokens": sum(
                len(s.trace.prompt_ids) + len(s.trace.response_ids) for s in scored
            ),
            "trained_tokens": totals["tokens"],
            "loss": sums["loss"],
            "pg_loss": sums["pg_loss"],
            "kl": sums["kl"] / tokens,
            "clip_fraction": sums["clip"] / tokens,
            "grad_norm": max(grad_norms) if grad_norms else 0.0,
            "optimizer_steps": totals["optimizer_steps"],
            "logprob_mismatch": statistics.fmean(mismatch) if mismatch else 0.0,
            "logprob_mismatch_max": max(mismatch) if mismatch else 0.0,
        }

    def _fill_behaviour(
        self, pairs: list[tuple[ScoredTrace, float]]
    ) -> list[tuple[ScoredTrace, float]]:
        """Traces without engine logprobs get the current (pre-update) model's, flagged."""
        missing = [i for i, (s, _) in enumerate(pairs) if s.trace.response_logprobs is None]
        if not missing:
            return pairs
        log.warning("%d trace(s) lack rollout logprobs; recomputing them", len(missing))
        filled = list(pairs)
        pad = int(self.core.tokenizer.pad_token_id or 0)
        for group in _chunks(missing, self.config.optim.micro_batch_size):
            batch = make_batch([pairs[i][0] for i in group], [0.0] * len(group), pad)
            with torch.no_grad():
                logp = response_logprobs(self.module, batch, self.temperature)
            for row, i in enumerate(group):
                s, w = pairs[i]
                n = len(s.trace.response_ids)
                marked = s.trace.with_stats(TraceStats(behaviour_logprobs="recomputed"))
                trace = marked.model_copy(update={"response_logprobs": logp[row, :n].tolist()})
                filled[i] = (replace(s, trace=trace), w)
        return filled

    # -- tasks, checkpoints ----------------------------------------------------------------

    def _tasks(
        self,
        split: str,
        step: int,
        count: int,
        num_samples: int,
        tag: str = "",
        source_split: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> list[TaskRequest]:
        cfg = self.config
        merged = {**cfg.tasks.options, **(options or {})}
        tasks = self.source(source_split or split, step, count, cfg.seed, **merged)
        out = []
        for i, task in enumerate(tasks):
            task_id = f"{split}{tag}-{step}-{i}"
            metadata = {
                **task.metadata,
                "group_id": task_id,
                "rollout_step": step,
                "policy_version": self.core.policy_version,
            }
            out.append(
                task.model_copy(
                    update={"task_id": task_id, "num_samples": num_samples, "metadata": metadata}
                )
            )
        return out

    def save(self) -> Path:
        state = TrainerState(self.step, self.core.policy_version, self.config.seed)
        path = save_checkpoint(self.out, self.module, self.core.tokenizer, self.optimizer, state)
        prune_checkpoints(self.out, self.config.checkpoint.keep)
        return path

    def _resume(self) -> None:
        path = latest_checkpoint(self.out)
        if path is None:
            return
        with self.core.weights_update(bump=False):
            state = load_checkpoint(path, self.module, self.optimizer)
        while self.core.policy_version < state.policy_version:
            self.core.bump_policy_version()
        self.step = state.step
        self.rng = random.Random(f"{self.config.seed}:{state.step}")
        self.echo(f"resumed from {path} (step {state.step})")


def _outcomes(results: Sequence[SessionResult]) -> dict[str, Any]:
    """Reward and pass statistics over sessions (failed ones count as not passed)."""
    rewards = [r.reward for r in results if r.reward is not None]
    passed = [r.passed for r in results]
    statuses = Counter(r.status.value for r in results)
    delivery = TokenDelivery.total(r.delivery for r in results)
    return {
        "sessions": len(results),
        "statuses": dict(statuses),
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "pass_rate": sum(passed) / len(passed) if passed else 0.0,
        # the share of sampled tokens that reached a trainable trace, and where the rest went
        "delivered_fraction": delivery.fraction or 0.0,
        "delivery": delivery.metrics(),
        **_session_shape(results),
    }


def _by_kind(
    results: Sequence[SessionResult], kinds: dict[str, Any]
) -> dict[str, dict[str, float]]:
    """Pass rate per task kind (``metadata.kind``), when the tasks have kinds: a family whose
    warm start leaves a kind out shows what GRPO learned there."""
    groups: dict[str, list[SessionResult]] = {}
    for r in results:
        kind = kinds.get(r.task_id)
        if kind is not None:
            groups.setdefault(str(kind), []).append(r)
    if not groups:
        return {}
    return {"by_kind": {k: _outcomes(rs)["pass_rate"] for k, rs in sorted(groups.items())}}


def _session_shape(results: Sequence[SessionResult]) -> dict[str, Any]:
    """How long sessions were and how well their calls merged: model calls per session and per
    trace, traces per session, and merge breaks (a chain that had to start a new segment: a
    retry, a prompt that did not extend the last one, drift) summed over the sessions."""
    trajectories = [r.trajectory for r in results if r.trajectory is not None]
    traces = [t for traj in trajectories for t in traj.traces]
    calls = [traj.stats.num_calls for traj in trajectories]
    breaks = Counter[str]()
    for traj in trajectories:
        breaks.update(traj.stats.breaks)
    return {
        "calls_per_session": statistics.fmean(calls) if calls else 0.0,
        "calls_per_trace": (statistics.fmean(t.stats.num_calls for t in traces) if traces else 0.0),
        "traces_per_session": len(traces) / len(trajectories) if trajectories else 0.0,
        "merge_breaks": sum(breaks.values()),
        "merge_break_reasons": dict(sorted(breaks.items())),
    }


def _examples(results: Sequence[SessionResult], n: int) -> list[str]:
    texts = []
    for r in results[:n]:
        traj = r.trajectory
        if traj is not None and traj.traces and traj.traces[0].response_messages:
            texts.append(str(traj.traces[0].response_messages[-1].get("content") or ""))
    return texts


def _every(seconds: float, report: Callable[[int], None]) -> Callable[[int], None]:
    """``report``, at most once per ``seconds`` (an evaluation takes minutes on a CPU)."""
    last = time.monotonic()

    def throttled(value: int) -> None:
        nonlocal last
        if time.monotonic() - last >= seconds:
            last = time.monotonic()
            report(value)

    return throttled


def _split(items: list[Any], parts: int) -> list[list[Any]]:
    size = math.ceil(len(items) / parts) if items else 0
    return [items[i : i + size] for i in range(0, len(items), size)] if size else []


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
