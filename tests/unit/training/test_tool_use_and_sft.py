"""The tool_use task family (splits, checks, solutions), the demonstrator's script, and the SFT
loss (the shared-prefix forward gives a full forward's loss and gradient)."""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path

import pytest
import torch

from polar.engines.embedded import load_model
from polar.errors import ConfigError
from polar.harnesses import codex, pi
from polar.harnesses.base import ShellTool
from polar.stack.demonstrator import solution_script
from polar.training import sft
from polar.training.tasks import task_source
from polar.training.tool_use import KINDS, LONG_KINDS, chores, split_chores


def test_the_held_out_split_is_fixed_and_disjoint() -> None:
    train, held = split_chores("train"), split_chores("eval")
    assert {c.params for c in train}.isdisjoint({c.params for c in held})
    assert len(train) + len(held) == len([c for c in chores() if c.kind in KINDS])
    assert {c.kind for c in held} == set(KINDS)  # every kind is evaluated
    source = task_source("tool_use")
    first = [t.instruction for t in source("eval", 0, 9, seed=3)]
    assert first == [t.instruction for t in source("eval", 5, 9, seed=3)]  # any step
    eval_files = {tuple(sorted(t.runtime.files.items())) for t in source("eval", 0, 50)}
    for step in range(1, 6):
        for task in source("train", step, 16):
            assert task.agent.harness == "pi" and task.runtime.kind == "bubblewrap"
            assert task.runtime.options["ro_binds"]
            if task.runtime.files:
                assert tuple(sorted(task.runtime.files.items())) not in eval_files
    # the builder ablation: the same tasks, one trace per call instead of one per session
    default, ablated = source("train", 1, 4), source("train", 1, 4, builder="per_request")
    assert {t.builder.strategy for t in default} == {"prefix_merging"}
    assert {t.builder.strategy for t in ablated} == {"per_request"}
    assert [t.instruction for t in default] == [t.instruction for t in ablated]


@pytest.mark.parametrize(
    "chore", [next(c for c in chores() if c.kind == k) for k in (*KINDS, *LONG_KINDS)]
)
def test_each_solution_passes_its_check_and_nothing_else_does(
    chore: object, tmp_path: Path
) -> None:
    def check() -> int:
        return subprocess.run(chore.check, shell=True, cwd=tmp_path).returncode  # type: ignore[attr-defined]

    for name, body in chore.files.items():  # type: ignore[attr-defined]
        (tmp_path / name).write_text(body)
    assert check() != 0  # needs the tool call
    for command in chore.solution:  # type: ignore[attr-defined]
        subprocess.run(command, shell=True, cwd=tmp_path, check=True)
    assert check() == 0


def test_gather_chores_are_long_sessions_asked_for_by_name() -> None:
    """Not in the default kinds (the recipe's measured results stay as they are); 3 to 5 files
    read one call each, then the answer: 5 to 7 model calls with the closing reply."""
    assert "gather" not in KINDS
    assert {c.kind for c in split_chores("train")} == set(KINDS)
    held, train = split_chores("eval", ("gather",)), split_chores("train", ("gather",))
    assert (
        len(held) >= 30
        and len(train) >= 100
        and not {c.params for c in held} & {c.params for c in train}
    )
    assert {len(c.solution) for c in train} == {4, 5, 6}
    with pytest.raises(ConfigError, match="unknown tool_use kinds"):
        split_chores("train", ("gathr",))


def test_codex_runs_compact_and_a_pinned_eval_seed_fixes_the_held_out_chores() -> None:
    """tool_use through Codex gets Codex's compact preset (a one-line instructions file), and
    runs of different seeds with one ``eval_seed`` evaluate the same chores (bench/grpo_only)."""
    source = task_source("tool_use")
    (task,) = source("train", 1, 1, harness="codex")
    assert task.agent.settings == codex.COMPACT_SETTINGS
    assert source("train", 1, 1)[0].agent.settings == pi.COMPACT_SETTINGS

    def held_out(seed: int, **options: object) -> list[str]:
        return [t.instruction for t in source("eval", 0, 6, seed=seed, **options)]

    assert held_out(1) != held_out(2)  # the run's seed picks them by default
    assert held_out(1, eval_seed=0) == held_out(2, eval_seed=0) == held_out(0)
    trained = [t.instruction for t in source("train", 1, 6, seed=1, eval_seed=0)]
    assert trained == [t.instruction for t in source("train", 1, 6, seed=1)]  # eval only


def test_the_demonstrator_calls_the_shell_tool_per_command_then_summarises() -> None:
    script = solution_script({"task A": ["echo a > a", "cat a"]}, ShellTool("bash", "command"))
    assert script.choose("... task A ...", 0).tool_calls == [("bash", {"command": "echo a > a"})]
    assert script.choose("... task A ...", 1).tool_calls == [("bash", {"command": "cat a"})]
    assert script.choose("... task A ...", 2).content == "Done."


def test_the_shared_prefix_sft_loss_is_the_full_forward_loss() -> None:
    module = load_model("tiny").module
    rows = _rows(seed=0, prefix=30, tails=[5, 8, 11])

    def loss_and_grad() -> tuple[float, torch.Tensor]:
        module.zero_grad()
        loss, tokens = sft.sft_loss(module, rows, 0)
        assert tokens == sum(sum(r["assistant_masks"]) for r in rows)
        loss.backward()
        grads = [p.grad.flatten() for p in module.parameters() if p.grad is not None]
        return float(loss.detach()), torch.cat(grads)

    with warnings.catch_warnings(record=True) as seen:  # no library noise on the screen
        warnings.simplefilter("always")
        shared_loss, shared_grad = loss_and_grad()
    assert not [str(w.message) for w in seen if issubclass(w.category, FutureWarning)]
    original = sft._shared_prefix
    try:
        sft._shared_prefix = lambda ids, mask: 0  # type: ignore[assignment]
        full_loss, full_grad = loss_and_grad()
    finally:
        sft._shared_prefix = original
    assert shared_loss == pytest.approx(full_loss, rel=1e-5)
    assert torch.allclose(shared_grad, full_grad, atol=1e-6)
    ids = torch.tensor([r["input_ids"][:35] for r in rows])
    mask = torch.tensor([r["assistant_masks"][:35] for r in rows])
    assert original(ids, mask) == 30  # the whole common prefix, before the first target


def test_sft_steps_in_parts_give_the_same_update_as_whole_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """forward_rows splits a step's rows into forward passes (memory), not its gradient: with
    plain SGD and no clipping, the weights move by exactly the same gradient either way."""
    monkeypatch.setattr(sft.torch.optim, "AdamW", lambda params, lr: torch.optim.SGD(params, lr))
    rows = _rows(seed=1, prefix=20, tails=[4, 9, 14, 19])

    def trained(forward_rows: int) -> tuple[list[torch.Tensor], float]:
        module = load_model("tiny").module
        [record] = sft.fine_tune(
            module, rows, epochs=1, lr=1.0, micro_batch_size=4, grad_clip=1e9, pad_id=0,
            seed=0, forward_rows=forward_rows,
        )  # fmt: skip
        return [p.detach().clone() for p in module.parameters()], record["loss"]

    (whole, whole_loss), (parts, parts_loss) = trained(4), trained(1)
    assert parts_loss == pytest.approx(whole_loss, rel=1e-5)
    for a, b in zip(whole, parts, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    untouched = load_model("tiny").module
    assert any(not torch.equal(a, b) for a, b in zip(whole, untouched.parameters(), strict=True))


def test_tasks_the_demonstrator_cannot_tell_apart_go_in_different_waves() -> None:
    tasks = task_source("tool_use")("train", 1, 40)
    waves = sft.waves(tasks)
    assert sorted(t.task_id for w in waves for t in w) == sorted(t.task_id for t in tasks)
    for wave in waves:
        solutions: dict[str, list[str]] = {}
        for task in wave:
            assert (
                solutions.setdefault(task.instruction, task.metadata["solution"])
                == (task.metadata["solution"])
            )
    assert len(waves) > 1  # 40 draws repeat some instruction with another answer


def test_checkpointed_sft_recomputes_whole_rows_and_gives_the_same_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With gradient checkpointing (the default: the warm start's activations were a run's
    peak) each layer runs twice over whole rows, forward then recomputed in backward, no
    prefix shared through a cache; the update is the shared-prefix one (plain SGD)."""
    monkeypatch.setattr(sft.torch.optim, "AdamW", lambda params, lr: torch.optim.SGD(params, lr))
    rows = _rows(seed=2, prefix=24, tails=[6, 10])

    def trained(checkpointing: bool) -> tuple[list[torch.Tensor], list[int], bool]:
        module = load_model("tiny").module
        module.eval()
        widths: list[int] = []
        # inside the layer: a recompute replays the layer's forward, not its hooks
        first_mlp = module.base_model.layers[0].mlp
        first_mlp.register_forward_pre_hook(lambda _m, args: widths.append(args[0].shape[1]))
        sft.fine_tune(
            module, rows, epochs=1, lr=1.0, micro_batch_size=2, grad_clip=1e9, pad_id=0,
            seed=0, forward_rows=2, gradient_checkpointing=checkpointing,
        )  # fmt: skip
        return [p.detach().clone() for p in module.parameters()], widths, module.training

    shared, shared_widths, _ = trained(False)
    recomputed, recomputed_widths, left_training = trained(True)
    width = max(len(r["input_ids"]) for r in rows)
    assert shared_widths == [24, width - 24]  # the common prefix once, then the rows past it
    assert recomputed_widths == [width, width]  # whole rows, forward and recomputed
    assert not left_training  # back in eval mode: the engine serves this module
    for a, b in zip(shared, recomputed, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def _rows(seed: int, prefix: int, tails: list[int]) -> list[dict[str, list[int]]]:
    """SFT rows sharing a random ``prefix``-token start, each row's own tail scored from its
    third token on (the first two stand for a template's turn header)."""
    generator = torch.Generator().manual_seed(seed)
    start = torch.randint(5, 1000, (prefix,), generator=generator).tolist()
    rows = []
    for length in tails:
        tail = torch.randint(5, 1000, (length,), generator=generator).tolist()
        mask = [0] * (prefix + 2) + [1] * (length - 2)
        rows.append({"input_ids": start + tail, "assistant_masks": mask})
    return rows
