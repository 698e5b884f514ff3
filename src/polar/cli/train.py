"""``polar train CONFIG``: the embedded GRPO trainer (rollouts through Polar, CPU updates)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from polar.extras import require
from polar.training.trainer_config import TrainConfig

BUNDLED = Path(__file__).resolve().parent.parent / "training" / "configs"


def add_parser(sub: Any) -> None:
    train = sub.add_parser(
        "train",
        help="GRPO on the embedded engine: rollouts through Polar update the served model",
    )
    train.add_argument(
        "config",
        help=f"training YAML, or the name of a bundled one ({', '.join(bundled_names())})",
    )
    train.add_argument("--steps", type=int, help="override the number of steps")
    train.add_argument("--output-dir", help="override output_dir")
    train.add_argument("--model", help="override the model (smollm2, tiny, a directory)")
    train.add_argument(
        "--no-resume", action="store_true", help="start over even if a checkpoint exists"
    )
    train.set_defaults(func=run_train)


def bundled_names() -> list[str]:
    return sorted(p.stem for p in BUNDLED.glob("*.yaml"))


def load_config(name_or_path: str) -> TrainConfig:
    path = Path(name_or_path)
    if not path.exists() and (BUNDLED / f"{name_or_path}.yaml").exists():
        path = BUNDLED / f"{name_or_path}.yaml"
    return TrainConfig.from_yaml(path)


def run_train(args: argparse.Namespace) -> int:
    require("train", "polar train")
    from polar.training.trainer import EmbeddedTrainer

    config = load_config(args.config)
    updates: dict[str, Any] = {}
    if args.steps is not None:
        updates["steps"] = args.steps
    if args.output_dir:
        updates["output_dir"] = Path(args.output_dir)
    if args.model:
        updates["model"] = args.model
    if updates:
        config = config.model_copy(update=updates)
    trainer = EmbeddedTrainer(config, echo=print)
    summary = trainer.run(resume=not args.no_resume)
    for record in summary["evals"]:
        print(f"held-out pass rate at step {record['step']}: {record['pass_rate']:.3f}")
    print(f"metrics: {config.output_dir / 'metrics.jsonl'}")
    if summary.get("plot"):
        print(f"reward curve: {summary['plot']}")
    return 0
