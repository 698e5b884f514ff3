"""A warm start: scripted demonstrations through the real harness, then SFT of the served model.

When GRPO has no signal at the start (a model that never calls a tool scores 0 everywhere),
the trainer first shows it what a solved task looks like in the harness's own protocol:

1. **Demonstrate.** Training tasks (never held-out ones) run through their own harness and
   runtime, exactly as rollouts do, but the engine is a *scripted demonstrator*
   (:func:`polar.stack.demonstrator.solution_script`), not a model: it answers each call
   of a task's session with a call of the harness's shell tool running the next of the task's
   ``solution`` commands, then with a one-line summary. It knows a session by its instruction,
   so tasks that ask the same thing with different answers run in separate waves. The CLI
   really runs the commands and the task's own check grades the workspace; only sessions that
   pass are kept. The tokens are
   the served model's: the scripted engine renders prompts with its tokenizer and chat
   template and samples by tokenizing the reply, so a kept session's prefix-merged trace is an
   SFT row in exactly the layout the model sees (``input_ids`` and ``assistant_masks``, the
   :class:`~polar.trajectory.exporters.sft.SFTExporter` row).
2. **Fine-tune.** Cross-entropy over the assistant-mask tokens (the sampled turns; the prompt,
   tool results and template tokens between turns are masked), a few epochs, its own AdamW.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from polar.client import RolloutClient
from polar.engines.embedded.kv_cache import cache_keyword
from polar.engines.registry import EngineConfig
from polar.engines.scripted import ScriptedEngine
from polar.engines.scripted_backend import ScriptedBackend
from polar.errors import ConfigError
from polar.schemas.task import SessionResult, TaskRequest
from polar.stack.demonstrator import shell_tool, solution_script
from polar.stack.local import LocalStack
from polar.training.checkpointing import checkpointed
from polar.trajectory.exporters.sft import SFTExporter

SFT_FILE = "sft.jsonl"
"""The accepted demonstrations, as SFT rows, in the run's output directory."""


def demonstrate(
    tasks: Sequence[TaskRequest],
    work: Path,
    *,
    tokenizer: Any,
    model_name: str,
    context_window: int,
    runtime: str | None,
    run_workers: int,
    timeout_s: float,
) -> tuple[list[dict[str, Any]], list[SessionResult]]:
    """Run ``tasks`` through their harness with the scripted demonstrator as the engine; the
    SFT rows of the sessions whose check passed, and every session's result."""
    harnesses = {t.agent.harness or "" for t in tasks}
    if len(harnesses) != 1:
        raise ConfigError(f"a warm start needs tasks of one harness, not {sorted(harnesses)}")
    missing = [t.task_id for t in tasks if not t.metadata.get("solution")]
    if missing:
        raise ConfigError(
            f"sft needs tasks with a known solution (metadata.solution: shell commands); "
            f"{missing[0]} has none"
        )
    tool = shell_tool(harnesses.pop())
    backend = ScriptedBackend(
        tokenizer=tokenizer, model_name=model_name, max_model_len=context_window
    )
    stack = LocalStack(
        ScriptedEngine(backend),
        work,
        engine_config=EngineConfig(kind="scripted"),
        served_model=model_name,
        context_window=context_window,
        runtime=runtime,
        run_workers=run_workers,
    )
    results: list[SessionResult] = []
    with stack, RolloutClient(stack.rollout_url, token=stack.rollout_token) as client:
        for wave in waves(tasks):
            solutions = {t.instruction: list(t.metadata["solution"]) for t in wave}
            backend.script = solution_script(solutions, tool)
            results += [r for t in client.run(wave, timeout_s) for r in t.results]
    accepted = [r.trajectory for r in results if r.passed and r.trajectory is not None]
    return list(SFTExporter().rows(accepted)), results


def waves(tasks: Sequence[TaskRequest]) -> list[list[TaskRequest]]:
    """Tasks in runs the demonstrator can tell apart: it knows a session by its instruction, so
    tasks asking the same thing with different solutions (the same script name, a different
    script) go in different waves."""
    out: list[list[TaskRequest]] = []
    for task in tasks:
        solution = task.metadata["solution"]
        wave = next(
            (
                w
                for w in out
                if all(
                    t.instruction != task.instruction or t.metadata["solution"] == solution
                    for t in w
                )
            ),
            None,
        )
        if wave is None:
            out.append([task])
        else:
            wave.append(task)
    return out


def sft_loss(
    module: Any, rows: Sequence[dict[str, Any]], pad_id: int, *, share_prefix: bool = True
) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy over the rows' assistant-mask tokens, and how many there were.

    Rows of one harness share a long prompt prefix (system prompt, tool schemas): with
    ``share_prefix`` it goes through the model once, its keys and values repeated for every
    row, and only the rest of each row after it. The gradient is the same as a full forward of
    every row (a causal model's prefix activations do not depend on what follows), for a
    fraction of the compute. Under gradient checkpointing the prefix is not shared (a
    checkpointed forward does not honour a cache).
    """
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        ids[i, :n] = torch.tensor(row["input_ids"])
        attention[i, :n] = 1
        mask[i, :n] = torch.tensor(row["assistant_masks"])
    shared = _shared_prefix(ids, mask) if share_prefix else 0
    cache = None
    if shared:
        cache = module.base_model(input_ids=ids[:1, :shared], use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(rows))
    hidden = module.base_model(
        input_ids=ids[:, shared:],
        attention_mask=attention,
        **{cache_keyword(module.base_model): cache},
    )[0]
    # the hidden state at p predicts token p + 1; only the masked targets go through the LM
    # head (a fifth of a small model's compute, and most of its memory at 49k vocabulary)
    keep = mask[:, shared + 1 :].bool()
    logits = module.get_output_embeddings()(hidden[:, :-1][keep]).float()
    tokens = int(keep.sum())
    loss = torch.nn.functional.cross_entropy(logits, ids[:, shared + 1 :][keep], reduction="sum")
    return loss / max(tokens, 1), tokens


def _shared_prefix(ids: torch.Tensor, mask: torch.Tensor) -> int:
    """How many leading tokens all rows share, stopping before the first scored position."""
    same = (ids == ids[:1]).all(dim=0).long()
    common = int(same.cumprod(0).sum())
    first_target = int(mask.argmax(dim=1).min()) if bool(mask.any()) else ids.shape[1]
    return max(min(common, first_target - 1, ids.shape[1] - 1), 0)


def fine_tune(
    module: Any,
    rows: Sequence[dict[str, Any]],
    *,
    epochs: int,
    lr: float,
    micro_batch_size: int,
    grad_clip: float,
    pad_id: int,
    seed: int,
    forward_rows: int | None = None,
    gradient_checkpointing: bool = False,
) -> list[dict[str, Any]]:
    """``epochs`` passes of SFT over ``rows`` (one optimizer step per ``micro_batch_size``
    rows); one record of mean loss per epoch.

    A step's rows go through the model ``forward_rows`` at a time, each part's summed loss
    backpropagated and the sum divided by the step's token count: the same gradient as one
    forward of all of them, with a fraction of the activations held at once.
    ``gradient_checkpointing`` keeps only each layer's input (the rows' shared prefix is then
    recomputed per row: more compute, a fraction of the memory).
    """
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    part = max(1, forward_rows or micro_batch_size)
    rng = random.Random(seed)
    records = []
    with checkpointed(module, gradient_checkpointing) as recomputing:
        for epoch in range(1, epochs + 1):
            order = list(rows)
            rng.shuffle(order)
            losses, tokens = [], 0
            for start in range(0, len(order), micro_batch_size):
                optimizer.zero_grad(set_to_none=True)
                step = order[start : start + micro_batch_size]
                summed, count = 0.0, 0
                for first in range(0, len(step), part):
                    part_rows = step[first : first + part]
                    loss, n = sft_loss(module, part_rows, pad_id, share_prefix=not recomputing)
                    (loss * n).backward()
                    summed += float(loss.detach()) * n
                    count += n
                for p in params:
                    if p.grad is not None:
                        p.grad /= max(count, 1)
                torch.nn.utils.clip_grad_norm_(module.parameters(), grad_clip)
                optimizer.step()
                losses.append(summed / max(count, 1))
                tokens += count
            mean = statistics.fmean(losses) if losses else 0.0
            records.append({"epoch": epoch, "loss": mean, "tokens": tokens})
    optimizer.zero_grad(set_to_none=True)
    return records
