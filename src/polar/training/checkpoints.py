"""Checkpoints of the embedded trainer: weights, optimizer, and where the run stood.

``<output_dir>/checkpoints/step-000010/`` holds the model as a Hugging Face checkpoint (so
``model: <that dir>`` in a config, or ``polar serve-engine --model <that dir>``, serves it),
its tokenizer, ``optimizer.pt`` and ``trainer_state.json``. A checkpoint is written to a
staging directory and renamed into place, so a crash never leaves a half-written one that
resume would pick up.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
import torch

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"


@dataclass
class TrainerState:
    step: int
    policy_version: int
    seed: int


def checkpoint_dir(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step-{step:06d}"


def save_checkpoint(
    out: Path, module: Any, tokenizer: Any, optimizer: torch.optim.Optimizer, state: TrainerState
) -> Path:
    target = checkpoint_dir(out, state.step)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".save-", dir=target.parent))
    try:
        module.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        torch.save(optimizer.state_dict(), staging / OPTIMIZER_FILE)
        (staging / STATE_FILE).write_bytes(orjson.dumps(asdict(state)))
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint under ``out``, if any."""
    root = out / "checkpoints"
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("step-*") if (p / STATE_FILE).is_file())
    return done[-1] if done else None


def prune_checkpoints(out: Path, keep: int) -> None:
    root = out / "checkpoints"
    done = sorted(p for p in root.glob("step-*") if (p / STATE_FILE).is_file())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(path: Path, module: Any, optimizer: torch.optim.Optimizer) -> TrainerState:
    """Copy the checkpoint's weights into ``module`` (in place: it may be served) and its
    optimizer state into ``optimizer``."""
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=module.dtype, local_files_only=True
    )
    with torch.no_grad():
        module.load_state_dict(saved.state_dict(), strict=True)
    optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE, weights_only=True))
    return TrainerState(**orjson.loads((path / STATE_FILE).read_bytes()))
