"""The NeMo Gym agent's pure converter, loaded by path: it lives in Gym's search root
(integrations/nemo_gym), not in the polar package, and imports neither polar nor nemo_gym."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

AGENT_DIR = (
    Path(__file__).resolve().parents[3] / "integrations/nemo_gym/responses_api_agents/polar_agent"
)


def load() -> ModuleType:
    name = "polar_gym_convert"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, AGENT_DIR / "convert.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def nemo_rl_walk(record: dict) -> list[dict]:
    """NeMo RL's ``_postprocess_nemo_gym_to_nemo_rl_result`` walk (nemo_rl/environments/
    nemo_gym.py), without torch: items lacking ``generation_token_ids`` are skipped, each
    other item's prompt must start with everything seen so far, and the chain alternates
    untrained new-prompt messages and trained generations. Raises on a non-contiguous item
    and on a record with no token-bearing item, as NeMo RL does."""
    log: list[dict] = []
    seen: list[int] = []
    for item in record["response"]["output"]:
        if "generation_token_ids" not in item:
            continue
        prompt = item["prompt_token_ids"]
        if seen and prompt[: len(seen)] != seen:
            raise AssertionError("Non-contiguous messages found!")
        new = prompt[len(seen) :]
        log.append({"role": "user", "token_ids": new})
        log.append(
            {
                "role": "assistant",
                "token_ids": item["generation_token_ids"],
                "generation_logprobs": item["generation_log_probs"],
            }
        )
        seen = seen + new + item["generation_token_ids"]
    if not log:
        raise ValueError("NeMo Gym returned a result with no generation data.")
    return log


def gym_contiguity(response: dict) -> None:
    """Gym's ``token_id_capture.builder.assert_prefix_contiguity`` (0.7.0)."""
    seen: list[int] = []
    for item in response.get("output", []):
        if not isinstance(item, dict) or item.get("generation_token_ids") is None:
            continue
        prompt = item.get("prompt_token_ids") or []
        if prompt[: len(seen)] != seen:
            raise AssertionError("projection is not prefix-contiguous")
        seen = list(prompt) + list(item["generation_token_ids"])
