"""Where a training run's numbers go: JSON lines (always), TensorBoard (when installed), a PNG.

``metrics.jsonl`` holds one line per training step, ``eval.jsonl`` one per evaluation,
``warm_start.jsonl`` the warm start's (demonstrations and SFT epochs) when there is one; all
are the source of truth the plot and the benchmark read. A resumed run first cuts both back to
the checkpoint's step, so a step that ran after the last checkpoint is not counted twice.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from polar.schemas.trajectory import MaskReason, Trace

if TYPE_CHECKING:
    from polar.training.staleness import Consumed

log = logging.getLogger("polar.training")

TRAIN_FILE = "metrics.jsonl"
EVAL_FILE = "eval.jsonl"
WARM_START_FILE = "warm_start.jsonl"
PLOT_FILE = "reward_curve.png"


def staleness(
    traces: Iterable[Trace], policy_version: int, consumed: Consumed | None = None
) -> dict[str, Any]:
    """How far behind ``policy_version`` (the trainer's, at consumption) a step's sampled
    turns were, and what was masked.

    Turns masked ``stale`` (by the builder, or by the trainer's ``max_staleness`` when it took
    the session) are counted, not dropped; ``consumed`` says how many of them the trainer
    masked itself. The lag of every call with a recorded version is reported, masked or not.
    """
    turns = tokens = 0
    lags: list[int] = []
    for trace in traces:
        for span in trace.masked:
            if span.reason is MaskReason.STALE:
                turns += 1
                tokens += span.end - span.start
        lags += [policy_version - v for v in trace.stats.call_versions if v is not None]
    return {
        "stale_turns": turns,
        "stale_tokens": tokens,
        "version_lag_max": max(lags, default=0),
        "version_lag_mean": sum(lags) / len(lags) if lags else 0.0,
        "masked_at_consumption_turns": consumed.masked_calls if consumed else 0,
        "masked_at_consumption_tokens": consumed.masked_tokens if consumed else 0,
    }


class MetricsLog:
    def __init__(self, out: Path, *, tensorboard: bool = True) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.writer: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(out / "tensorboard"))
            except ImportError:
                log.warning("tensorboard is not installed; metrics go to JSON lines only")

    def truncate(self, last_step: int) -> None:
        """Forget lines past ``last_step`` (a resumed run redoes those steps)."""
        for name in (TRAIN_FILE, EVAL_FILE, WARM_START_FILE):
            kept = [r for r in read_jsonl(self.out / name) if int(r["step"]) <= last_step]
            with (self.out / name).open("wb") as f:
                f.writelines(orjson.dumps(r) + b"\n" for r in kept)

    def train(self, record: Mapping[str, Any]) -> None:
        self._append(TRAIN_FILE, record, "train")

    def eval(self, record: Mapping[str, Any]) -> None:
        self._append(EVAL_FILE, record, "eval")

    def sft(self, record: Mapping[str, Any]) -> None:
        self._append(WARM_START_FILE, record, "sft")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def _append(self, name: str, record: Mapping[str, Any], prefix: str) -> None:
        with (self.out / name).open("ab") as f:
            f.write(orjson.dumps(dict(record)) + b"\n")
        if self.writer is not None:
            step = int(record["step"])
            for key, value in record.items():
                if isinstance(value, int | float) and not isinstance(value, bool) and key != "step":
                    self.writer.add_scalar(f"{prefix}/{key}", value, step)
            self.writer.flush()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def pyplot() -> Any | None:
    """``matplotlib.pyplot`` on the file-only Agg backend, or None (it is an optional extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_rewards(out: Path, title: str = "GRPO through Polar") -> Path | None:
    """The reward curve (mean with a standard-error band, pass rate) and eval points, as a PNG."""
    plt = pyplot()
    if plt is None:
        log.warning("matplotlib is not installed; no reward-curve PNG")
        return None
    train = read_jsonl(out / TRAIN_FILE)
    evals = read_jsonl(out / EVAL_FILE)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if train:
        steps = [r["step"] for r in train]
        mean = [r["reward_mean"] for r in train]
        # the standard error of each step's mean: how far the curve's wiggles are noise
        err = [r["reward_std"] / math.sqrt(max(r["sessions"], 1)) for r in train]
        ax.plot(steps, mean, label="train reward (mean)", color="tab:blue", linewidth=2)
        ax.fill_between(
            steps,
            [m - e for m, e in zip(mean, err, strict=True)],
            [m + e for m, e in zip(mean, err, strict=True)],
            color="tab:blue",
            alpha=0.15,
            label="± standard error",
        )
        ax.plot(
            steps,
            [r["pass_rate"] for r in train],
            ":",
            label="train pass rate",
            color="tab:green",
        )
    if evals:
        ax.plot(
            [r["step"] for r in evals],
            [r["pass_rate"] for r in evals],
            "o--",
            color="tab:red",
            label="held-out pass rate",
        )
    ax.set_xlabel("step")
    ax.set_ylabel("reward / pass rate")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    path = out / PLOT_FILE
    fig.savefig(path)
    plt.close(fig)
    return path
