"""Pure conversions between NeMo Gym's ``/run`` contract and Polar's rollout server, on plain dicts.

This module imports neither ``nemo_gym`` nor ``polar``: the agent server (``app.py``, Python
>= 3.13 with nemo-gym's pins) wraps it in Gym's types, and Polar's own test suite (Python 3.11)
imports it by path and property-tests it.

Two directions:

- a Gym row becomes one Polar ``TaskRequest`` body (:func:`task_request`);
- the session's ``SessionResult`` becomes the fields of Gym's ``BaseVerifyResponse``
  (:func:`gym_record`): Responses output items, the last item of each model call carrying
  ``prompt_token_ids`` / ``generation_token_ids`` / ``generation_log_probs``, the reward, and
  ``mask_sample`` / ``failure_kind`` / ``failure_reason`` from the session's failure.

NeMo RL turns a Gym record into one token chain and asserts that each call's prompt extends
everything before it. Items built from a prefix-merged trace are contiguous by construction
(call k's prompt is the trace prompt plus the response up to the call), but that is only
faithful when call k's context in the trace is exactly the prompt the engine saw. The
exactness gate (:func:`token_chain`) therefore ends the chain at the first call whose merged
context is not the engine's prompt.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Polar's SessionFailure.kind -> Gym's shared failure vocabulary (nemo_gym/failure_kinds.py).
FAILURE_KINDS: dict[str, str] = {
    "agent": "agent_run_error",
    "timeout": "agent_timeout",
    "evaluator": "verifier_error",
    "infra": "provider_unavailable",
}
# A timeout's partial trace was sampled by the policy and graded by the evaluator: a valid
# (if poor) measurement, so it is not masked. Everything else says nothing about the policy.
UNMASKED_FAILURES = frozenset({"timeout"})
CANCELLED = "cancelled"
# When a result carries no ``failure`` (an older rollout server), its status decides.
STATUS_FAILURES: dict[str, str] = {"ERROR": "agent", "TIMEOUT": "timeout"}

# Why a record carries fewer token-bearing calls than its session made.
GATE_INEXACT_CONTEXT = "inexact_context"
GATE_NO_LOGPROBS = "no_logprobs"

MAX_TASK_ID = 128
MAX_REASON = 2000
_UNSAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_INPUT_ROLES = ("system", "developer", "user")


class RowError(ValueError):
    """A Gym row that cannot become a Polar task (the message says what to fix)."""


# -- row -> TaskRequest ----------------------------------------------------------------


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` laid over ``base``: mappings merge key by key, anything else replaces."""
    merged = dict(base)
    for key, value in override.items():
        old = merged.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            merged[key] = deep_merge(old, value)
        else:
            merged[key] = value
    return merged


def message_text(content: Any) -> str:
    """The text of a Responses/Chat message's ``content`` (a string or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            parts.append(part["text"])
    return "".join(parts)


def instruction_from_input(input_: Any) -> str:
    """The harness instruction from ``responses_create_params.input``.

    A Polar harness takes one instruction string, so the system, developer and user messages
    are joined in order (blank line between); assistant turns and tool items are not part of
    a task's instruction and are left out.
    """
    if isinstance(input_, str):
        return input_
    texts = []
    for item in input_ or []:
        if not isinstance(item, Mapping):
            continue
        if item.get("role") in _INPUT_ROLES and item.get("type", "message") == "message":
            text = message_text(item.get("content")).strip()
            if text:
                texts.append(text)
    return "\n\n".join(texts)


def rollout_key(row: Mapping[str, Any]) -> str | None:
    """Gym's rollout identity for a ``/run`` body (``rollout_correlation``'s rule): the
    explicit ``_ng_rollout_id``, else ``{task}-{rollout}``, with ``-a{n}`` for a re-dispatch."""
    explicit = row.get("_ng_rollout_id")
    if explicit is not None:
        key = str(explicit)
    else:
        task, rollout = row.get("_ng_task_index"), row.get("_ng_rollout_index")
        if task is None or rollout is None:
            return None
        key = f"{task}-{rollout}"
    attempt = row.get("_ng_attempt_index")
    if attempt is not None and int(attempt) > 0:
        key = f"{key}-a{int(attempt)}"
    return key


def task_id_for(nonce: str, key: str) -> str:
    """A Polar task id for rollout ``key``: the same (nonce, key) always gives the same id, so a
    retried ``/run`` finds its task instead of starting a second session.

    Polar ids allow letters, digits, ``-`` and ``_`` (128 at most); a key that needed changing
    to fit gets a digest of the original appended, so two keys never share an id.
    """
    safe = _UNSAFE_ID_CHARS.sub("_", key)
    task_id = f"gym-{nonce}-{safe}"
    if safe != key or len(task_id) > MAX_TASK_ID:
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        task_id = f"{task_id[: MAX_TASK_ID - 17]}-{digest}"
    return task_id


def task_request(
    row: Mapping[str, Any],
    template: Mapping[str, Any],
    *,
    task_id: str,
    callback_url: str | None,
) -> dict[str, Any]:
    """The TaskRequest body for one Gym row: the agent's ``template`` with the row's
    ``polar_task`` laid over it, one sample, and the instruction from the row's messages
    unless ``polar_task.instruction`` names one. Row ``tools`` are ignored: the harness
    brings its own."""
    override = row.get("polar_task") or {}
    if not isinstance(override, Mapping):
        raise RowError(f"polar_task must be an object, got {type(override).__name__}")
    task = deep_merge(template, override)
    params = row.get("responses_create_params") or {}
    if not task.get("instruction"):
        task["instruction"] = instruction_from_input(params.get("input"))
    if not task["instruction"]:
        raise RowError(
            "the row has no instruction: no system/developer/user text in "
            "responses_create_params.input and no polar_task.instruction"
        )
    metadata = dict(task.get("metadata") or {})
    if row.get("_ng_task_index") is not None:
        metadata.setdefault("group_id", f"gym-task-{row['_ng_task_index']}")
    key = rollout_key(row)
    if key is not None:
        metadata["gym_rollout_id"] = key
    for name in ("policy_version", "rollout_step"):
        if name in row and name not in metadata:
            metadata[name] = row[name]
    task.update(task_id=task_id, num_samples=1, metadata=metadata)
    if callback_url:
        task["callback_url"] = callback_url
    return task


# -- SessionResult -> Gym record ---------------------------------------------------------


@dataclass
class Call:
    """One model call of the chain handed to Gym, as NeMo RL reads it."""

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]

    def fields(self) -> dict[str, Any]:
        return {
            "prompt_token_ids": self.prompt_token_ids,
            "generation_token_ids": self.generation_token_ids,
            "generation_log_probs": self.generation_log_probs,
        }


@dataclass
class Chain:
    """The calls of a trace that go to the trainer, and why any others do not."""

    calls: list[Call]
    num_calls: int
    gate: str | None = None

    @property
    def left_out_calls(self) -> int:
        return self.num_calls - len(self.calls)


def main_trace(traces: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The trace with the most trainable tokens, the first on a tie (Polar's bridges' rule:
    the agent's own chain; sub-agents and side chains are usually shorter)."""
    best: Mapping[str, Any] | None = None
    for trace in traces:
        if best is None or sum(trace["loss_mask"]) > sum(best["loss_mask"]):
            best = trace
    return best


def call_spans(trace: Mapping[str, Any]) -> list[tuple[int, int]]:
    """Each call's sampled ids as ``[start, end)`` in ``response_ids``: the builder's
    ``call_spans``, else the maximal runs of ``loss_mask == 1`` (the same spans whenever calls
    are separated by template glue, as chat templates always do)."""
    spans = (trace.get("metadata") or {}).get("call_spans")
    if spans is not None:
        return [(int(s), int(e)) for s, e in spans]
    runs: list[tuple[int, int]] = []
    start: int | None = None
    mask = list(trace["loss_mask"])
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def token_chain(trace: Mapping[str, Any]) -> Chain:
    """The calls NeMo RL may train on, in order, ending before the first call whose merged
    context differs from its engine prompt (or at once when the trace has no logprobs: Gym's
    token fields require them and Polar never guesses one)."""
    spans = call_spans(trace)
    if trace.get("response_logprobs") is None:
        return Chain([], len(spans), GATE_NO_LOGPROBS if spans else None)
    meta = trace.get("metadata") or {}
    inexact = set(meta.get("inexact_context_calls") or [])
    ids = list(meta.get("completion_ids") or [])
    prompt, response = list(trace["prompt_ids"]), list(trace["response_ids"])
    logprobs = list(trace["response_logprobs"])
    calls: list[Call] = []
    for k, (start, end) in enumerate(spans):
        if k < len(ids) and ids[k] in inexact:
            return Chain(calls, len(spans), GATE_INEXACT_CONTEXT)
        calls.append(Call(prompt + response[:start], response[start:end], logprobs[start:end]))
    return Chain(calls, len(spans))


def _turns(
    messages: Sequence[Mapping[str, Any]], num_calls: int
) -> list[list[Mapping[str, Any]]] | None:
    """``response_messages`` cut into one list per call: the messages the harness inserted
    before it (tool results, user text), then the call's reply. ``None`` when the assistant
    replies cannot be matched to the calls one to one."""
    if sum(1 for m in messages if m.get("role") == "assistant") != num_calls:
        return None
    turns: list[list[Mapping[str, Any]]] = [[]]
    for message in messages:
        turns[-1].append(message)
        if message.get("role") == "assistant":
            turns.append([])
    return turns[:num_calls]


def _reply_items(reply: Mapping[str, Any], k: int) -> list[dict[str, Any]]:
    """One reply's output items: reasoning, then its text, then each tool call."""
    items: list[dict[str, Any]] = []
    reasoning = reply.get("reasoning_content") or reply.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        items.append(
            {
                "id": f"rs_{k}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": reasoning}],
            }
        )
    text = message_text(reply.get("content"))
    if text or not reply.get("tool_calls"):
        items.append(_message(f"msg_{k}", text))
    for j, call in enumerate(reply.get("tool_calls") or []):
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {})
        call_id = str(call.get("id") or f"call_{k}_{j}")
        items.append(
            {
                "id": f"fc_{k}_{j}",
                "type": "function_call",
                "call_id": call_id,
                "name": str(function.get("name") or ""),
                "arguments": arguments,
                "status": "completed",
            }
        )
    return items


def _message(item_id: str, text: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _inserted_items(inserted: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tool results become ``function_call_output`` items. Inserted user text has no output
    item type in Responses; its tokens are already in the next call's prompt ids."""
    return [
        {
            "type": "function_call_output",
            "call_id": str(m.get("tool_call_id") or ""),
            "output": message_text(m.get("content")),
            "status": "completed",
        }
        for m in inserted
        if m.get("role") == "tool"
    ]


def output_items(trace: Mapping[str, Any], chain: Chain) -> tuple[list[dict[str, Any]], bool]:
    """Gym output items for ``trace``, token fields on the last item of each chained call.

    Calls past the chain's end keep their items (a Gym verifier reads the final answer) but
    carry no token fields, so NeMo RL skips them. Returns the items and whether each call's
    reply could be matched to its messages (if not, one bare message per call carries the
    tokens, and nothing is invented).
    """
    turns = _turns(trace.get("response_messages") or [], chain.num_calls)
    items: list[dict[str, Any]] = []
    for k in range(chain.num_calls):
        if turns is None:
            call_items = [_message(f"msg_{k}", "")]
        else:
            *inserted, reply = turns[k]
            items += _inserted_items(inserted)
            call_items = _reply_items(reply, k)
        if k < len(chain.calls):
            call_items[-1] = {**call_items[-1], **chain.calls[k].fields()}
        items += call_items
    return items, turns is not None


@dataclass
class Outcome:
    """How a session's end maps onto Gym's verify fields."""

    mask_sample: bool
    failure_kind: str | None = None
    failure_reason: str | None = None
    reasons: list[str] = field(default_factory=list)


def failure_outcome(result: Mapping[str, Any]) -> Outcome:
    """Gym's ``mask_sample`` / ``failure_kind`` / ``failure_reason`` for a session result:
    from its ``failure`` when set, else from its status (see :data:`FAILURE_KINDS`)."""
    failure = result.get("failure") or {}
    kind = failure.get("kind") or STATUS_FAILURES.get(str(result.get("status")))
    if kind is None:
        return Outcome(mask_sample=False)
    reason = failure.get("reason") or result.get("error") or ""
    gym_kind = FAILURE_KINDS.get(kind, f"polar:{kind}")
    if kind == "infra" and reason == CANCELLED:
        gym_kind = CANCELLED  # DELETE /tasks/{id}: Gym has a name for exactly this
    return Outcome(
        mask_sample=kind not in UNMASKED_FAILURES,
        failure_kind=gym_kind,
        failure_reason=reason[:MAX_REASON] or None,
    )


def gym_record(
    result: Mapping[str, Any],
    *,
    response_id: str,
    model: str,
    created_at: int,
    polar_reward: bool = True,
) -> dict[str, Any]:
    """The ``BaseVerifyResponse`` fields Polar decides for one finished session: ``response``
    (a Responses object), ``reward`` (Polar's evaluator; 0.0 when it gave none),
    ``mask_sample``, ``failure_kind``, ``failure_reason`` and ``polar_*`` diagnostics.
    With ``polar_reward`` false a Gym verifier grades instead, so a missing Polar reward is
    no failure."""
    trajectory = result.get("trajectory") or {}
    traces = list(trajectory.get("traces") or [])
    trace = main_trace(traces)
    outcome = failure_outcome(result)
    if trace is not None:
        chain = token_chain(trace)
        items, aligned = output_items(trace, chain)
        meta = trace.get("metadata") or {}
        if meta.get("trainable") is False:
            outcome.reasons += [f"untrainable: {r}" for r in meta.get("untrainable_reasons", [])]
    else:
        chain, items, aligned = Chain([], 0), [], True
    if chain.gate == GATE_NO_LOGPROBS:
        outcome.reasons.append("the engine returned no logprobs for this trace")
    if not chain.calls:
        # NeMo RL raises on a record with no token-bearing item unless it is masked.
        items = items or [_message("msg_0", "")]
        if trace is None:
            outcome.reasons.append(trajectory.get("error") or "the session produced no trace")
    reward = result.get("reward")
    if polar_reward and reward is None and outcome.failure_kind is None:
        outcome.failure_kind = FAILURE_KINDS["evaluator"]
        outcome.reasons.append("Polar's evaluator gave no reward")
    if outcome.reasons:
        outcome.mask_sample = True
        if outcome.failure_kind is None:
            outcome.failure_kind = "polar:untrainable"
        outcome.failure_reason = "; ".join(
            [r for r in [outcome.failure_reason, *outcome.reasons] if r]
        )[:MAX_REASON]
    prompt_len = len(trace["prompt_ids"]) if trace is not None else 0
    sampled = sum(len(c.generation_token_ids) for c in chain.calls)
    return {
        "response": response_object(
            items,
            response_id=response_id,
            model=model,
            created_at=created_at,
            input_tokens=prompt_len,
            output_tokens=sampled,
            metadata={
                "polar_session_id": str(result.get("session_id") or ""),
                "polar_task_id": str(result.get("task_id") or ""),
            },
        ),
        "reward": float(reward) if reward is not None else 0.0,
        "mask_sample": outcome.mask_sample,
        "failure_kind": outcome.failure_kind,
        "failure_reason": outcome.failure_reason,
        "polar_session_id": result.get("session_id"),
        "polar_status": result.get("status"),
        "polar_reward": reward,
        "polar_timing": dict(result.get("timing") or {}),
        "polar_trace_count": len(traces),
        "polar_left_out_traces": max(0, len(traces) - 1),
        "polar_calls": chain.num_calls,
        "polar_token_calls": len(chain.calls),
        "polar_left_out_calls": chain.left_out_calls,
        "polar_chain_end": chain.gate,
        "polar_items_aligned": aligned,
    }


def response_object(
    items: list[dict[str, Any]],
    *,
    response_id: str,
    model: str,
    created_at: int,
    input_tokens: int,
    output_tokens: int,
    metadata: Mapping[str, str],
) -> dict[str, Any]:
    """A minimal Responses ``response`` object around ``items`` (what ``NeMoGymResponse``
    validates). Its metadata values are strings, as the Responses API requires."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "model": model,
        "status": "completed",
        "output": items,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "metadata": dict(metadata),
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
    }
