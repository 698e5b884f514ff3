"""SWE instances as a trainer's task source (``polar train`` with ``tasks.source: swe``).

The train and eval splits are fixed by a hash of each instance id, so they never overlap and
stay the same across runs and machines: an instance is held out for eval when its hash falls
below ``eval_fraction``. A set too small to split that way (the bundled three: one split would
come out empty) uses every instance for both, so its eval measures what training saw.

Each training step draws ``count`` instances in a seeded order; eval takes the same instances
every time, so evaluations are comparable.
"""

from __future__ import annotations

import hashlib
import random
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from polar.config_loader import parse_config
from polar.errors import ConfigError
from polar.runtimes.registry import needs_image
from polar.schemas.task import TaskRequest
from polar.swe.bundled import bundle_repos, bundled_instances, default_bundle_dir
from polar.swe.instances import SWEInstance, load_instances
from polar.swe.tasks import SWETaskOptions, instance_task, swe_task_id


def swe_task_source(
    split: Literal["train", "eval"],
    step: int,
    count: int,
    seed: int = 0,
    *,
    instances: str | None = None,
    instances_split: str | None = None,
    eval_fraction: float = 0.1,
    repos_dir: str | None = None,
    **options: Any,
) -> list[TaskRequest]:
    """``count`` tasks of ``split``: from ``instances`` (a file, directory or cached Hub
    dataset; default the bundled set), with ``options`` as :class:`SWETaskOptions` keys.

    For the bundled set in a local runtime the repositories are bundled into ``repos_dir``
    (default ``$POLAR_SWE_BUNDLES`` or ``~/.cache/polar/swe-bundled``).
    """
    task_options = parse_config(
        SWETaskOptions,
        options,
        what="swe task source options (besides instances, instances_split, eval_fraction, "
        "repos_dir)",
    )
    if instances is None and not needs_image(task_options.runtime) and not task_options.repos:
        bundles = _bundles(repos_dir or str(default_bundle_dir()))
        task_options = task_options.model_copy(update={"repos": bundles})
    pool = split_instances(_instances(instances, instances_split), split, eval_fraction)
    order = list(pool)
    random.Random(f"{seed}:eval" if split == "eval" else f"{seed}:train:{step}").shuffle(order)
    chosen = [order[i % len(order)] for i in range(count)]
    return [
        instance_task(
            instance,
            task_options,
            task_id=swe_task_id(f"{split}-{seed}-{step}-{i}-{instance.instance_id}"),
        )
        for i, instance in enumerate(chosen)
    ]


def split_instances(
    instances: list[SWEInstance], split: Literal["train", "eval"], eval_fraction: float
) -> list[SWEInstance]:
    """The instances of ``split``, by instance-id hash; all of them when a split is empty."""
    held_out = [i for i in instances if _unit_hash(i.instance_id) < eval_fraction]
    kept = [i for i in instances if _unit_hash(i.instance_id) >= eval_fraction]
    if not held_out or not kept:
        return list(instances)
    return held_out if split == "eval" else kept


def _unit_hash(instance_id: str) -> float:
    """A stable number in [0, 1) for ``instance_id``."""
    return int(hashlib.sha256(instance_id.encode()).hexdigest()[:12], 16) / 16**12


@lru_cache(maxsize=8)
def _instances(source: str | None, split: str | None) -> list[SWEInstance]:
    loaded = bundled_instances() if source is None else load_instances(source, split)
    if not loaded:
        raise ConfigError(f"no SWE instances in {source}")
    return loaded


@lru_cache(maxsize=4)
def _bundles(directory: str) -> dict[str, str]:
    return {repo: str(path) for repo, path in bundle_repos(Path(directory)).items()}
