"""The capture record's flag vocabulary: what was missing, recovered or changed on a call.

The gateway and the engines write these names onto a record; builders, exporters and
``polar capture verify`` read them. They live here so a reader never imports the writer.
"""

from __future__ import annotations

# An engine reply lacked a token field, or it was recovered by a fallback.
FLAG_PROMPT_IDS_MISSING = "prompt_ids_missing"
FLAG_SAMPLED_IDS_MISSING = "sampled_ids_missing"
FLAG_SAMPLED_IDS_FROM_TOKEN_STRINGS = "sampled_ids_from_token_strings"
FLAG_LOGPROBS_MISSING = "logprobs_missing"
FLAG_LOGPROBS_MISALIGNED = "logprobs_misaligned"
FLAG_USAGE_MISMATCH = "usage_completion_tokens_mismatch"
FLAG_ABORTED = "aborted"
# The engine's echoed prompt ids differ from the ids the gateway sent.
FLAG_PROMPT_ECHO_MISMATCH = "engine_prompt_differs_from_sent"
# Routed experts do not cover exactly prompt + sampled - 1 positions.
FLAG_ROUTED_EXPERTS_MISALIGNED = "routed_experts_misaligned"
# A call whose session had been served by another replica that is now down (engine pool).
FLAG_REPLICA_MOVED = "engine_replica_moved"

# The call came over a Responses WebSocket (a response.create frame), not an HTTP POST.
FLAG_WEBSOCKET = "served_over_websocket"

# The gateway's policy changed the request.
FLAG_MAX_TOKENS_CLAMPED = "max_tokens_clamped"
FLAG_MAX_TOKENS_DEFAULTED = "max_tokens_defaulted"
FLAG_TOOL_CHOICE_ENFORCED = "tool_choice_enforced"

# Gateway-side rendering: how the prompt's ids were made.
FLAG_RENDERED_BY_GATEWAY = "rendered_by_gateway"
FLAG_SPLICED = "prompt_extends_sampled_turn"
FLAG_RENDERED_WHOLE = "prompt_rendered_whole"
FLAG_CLAMPED_TO_CONTEXT = "max_tokens_clamped_to_context"
FLAG_PARALLEL_CALLS_CUT = "parallel_tool_calls_kept_first"
# A spliced prompt carries past reasoning the family's template drops (reasoning_history: keep).
FLAG_REASONING_KEPT = "reasoning_history_keep"
