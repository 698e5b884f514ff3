"""Google's Interactions API (``POST /v1/interactions``, also ``/v1beta``), the steps schema (API
revision 2026-05-20, what google-genai 2+ speaks).

An interaction is stateful like an OpenAI Response: it is kept per session (``store``, default
true), fetched or deleted at ``GET``/``DELETE /v1beta/interactions/{id}``, and continued by
``previous_interaction_id``, whose whole context (the kept call's prompt and its answer, exactly
as captured) goes before the new input. As the API scopes them, ``system_instruction``, ``tools``
and ``generation_config`` belong to one interaction: a continuation's own lead the system
message, the earlier one is not carried over.

Every request field is honoured, mapped or refused by name (an unknown one too, as the API's
``parameter_unknown``): what runs inside Google's service (agents, background runs, built-in
tools, cached contents, environments, webhooks, continuation tokens) is refused, never dropped.
``generation_config.thinking_level`` is the reasoning effort; ``thinking_summaries`` whether a
thought step carries the reasoning as its summary (its signature always does, so replayed
history is exact and the record keeps the reasoning either way).

Errors are the API's own body, ``{"error": {"code": "invalid_request", "message": ...}}``; in a
stream, an ``error`` event. The input's folding lives in ``google_interactions_input.py``, the
steps, resource and stream events in ``google_interactions_output.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import unquote

from polar.errors import ContextLengthExceeded, GatewayError, InvalidRequest, NotFound
from polar.providers.base import (
    GENERATE,
    Provider,
    RequestContext,
    optional_number,
    require_dict,
    require_list,
    sse,
    stop_list,
)
from polar.providers.google import GoogleProvider
from polar.providers.google_interactions_input import input_messages
from polar.providers.google_interactions_output import (
    InteractionsState,
    interaction,
    interaction_id,
    interactions_state,
    output_steps,
    stream_frames,
)
from polar.providers.reasoning import effort
from polar.providers.routing import ProviderRouting
from polar.providers.stateful import RETRIEVE, StatefulReplies
from polar.providers.types import (
    CaptureTags,
    Completion,
    Message,
    NormalizedRequest,
    ReasoningControls,
    ResponseFormat,
    SamplingParams,
    Tool,
)

# ``/v1/interactions`` (google-genai's default now the API is GA), ``/v1beta/...``, also under a
# Vertex project and location; ``/{id}`` names one.
_PATH_RE = re.compile(
    r"^/v1(?:alpha|beta)?\d*(?:/projects/[^/]+/locations/[^/]+)?/interactions(?:/([^/]+))?(/cancel)?$"
)
# The steps schema's revision; an older one asks for the removed ``outputs`` schema.
_REVISION = "2026-05-20"

_FIELDS = frozenset(
    {
        "model", "input", "system_instruction", "tools", "generation_config", "stream",
        "store", "previous_interaction_id", "response_format", "response_mime_type",
        "response_modalities", "safety_settings", "service_tier", "labels", "agent",
        "agent_config", "background", "cached_content", "continuation_token", "environment",
        "webhook_config",
    }
)  # fmt: skip
# Fields whose feature runs inside Google's service: refused by name, with what to do instead.
_GOOGLE_SIDE = {
    "agent": "agents run inside Google's service; call a model",
    "agent_config": "agents run inside Google's service; call a model",
    "continuation_token": "this gateway never stops a decode for continuation, so it issues none",
    "environment": "remote environments run inside Google's service",
    "webhook_config": "this gateway sends no webhooks; wait for the reply or stream it",
}
_GENERATION_FIELDS = frozenset(
    {
        "temperature", "top_p", "seed", "stop_sequences", "max_output_tokens", "thinking_level",
        "thinking_summaries", "tool_choice", "image_config", "speech_config", "video_config",
        "transcription_config",
    }
)  # fmt: skip
_MEDIA_CONFIGS = ("image_config", "speech_config", "video_config", "transcription_config")
_THINKING_LEVELS = ("minimal", "low", "medium", "high", "xhigh")
_TOOL_CHOICES = {"auto": "auto", "validated": "auto", "any": "required", "none": "none"}
_SAFE_THRESHOLDS = ("off", "block_none")
_ECHOED = ("system_instruction", "tools", "generation_config", "previous_interaction_id", "labels")

_ERROR_CODES = {
    400: "invalid_request",
    401: "authentication",
    403: "permission_denied",
    404: "not_found",
    409: "aborted",
    413: "invalid_request",
    429: "rate_limit_exceeded",
    499: "cancelled",
    501: "unimplemented",
    503: "service_unavailable",
    504: "deadline_exceeded",
}


class GoogleInteractionsProvider(Provider, StatefulReplies):
    """Adapter for ``POST /v1/interactions`` and ``GET``/``DELETE /v1/interactions/{id}`` (also
    under ``/v1beta``; interactions stored per session)."""

    name: ClassVar[str] = "google_interactions"
    # google-genai's one client: the same base URL, key header and environment as generateContent.
    routing: ClassVar[ProviderRouting] = GoogleProvider.routing

    def operation(self, ctx: RequestContext) -> str | None:
        match = _PATH_RE.match(unquote(ctx.path).rstrip("/"))
        if match is None:
            return None
        method = ctx.method.upper()
        if match.group(1) is None:
            return GENERATE if method == "POST" else None
        if match.group(2) is not None:
            return RETRIEVE if method == "POST" else None  # cancel: refused in reply_id
        return RETRIEVE if method in ("GET", "DELETE") else None

    def parse_request(self, body: Any, ctx: RequestContext) -> NormalizedRequest:
        body = require_dict(body)
        _check_revision(ctx.headers)
        _refuse_unknown(body, _FIELDS, "")
        capture = CaptureTags()
        _refuse_google_side(body, capture)
        model = _model(body.get("model"))
        system = _optional_str(body, "system_instruction")
        own, input_steps = input_messages(body.get("input"))
        messages: list[Message] = [{"role": "system", "content": system}] if system else []
        messages.extend(own)
        tools = _tools(body.get("tools"), capture)
        gen = _generation_config(body.get("generation_config"), capture)
        state = InteractionsState(
            summaries=_summaries(gen.get("thinking_summaries"), capture),
            previous_interaction_id=_optional_str(body, "previous_interaction_id"),
            store=_optional_bool(body, "store") is not False,
            echo={key: body[key] for key in _ECHOED if body.get(key) is not None},
            input_steps=input_steps,
        )
        if state.previous_interaction_id:
            capture.feature("previous_interaction_id", "honoured")
        if state.store:
            capture.feature("store", "honoured")
        _check_accepted(body, capture, state)
        choice = _tool_choice(gen.get("tool_choice"), tools)  # checked even without tools
        return NormalizedRequest(
            provider=self.name,
            model=model,
            messages=messages,
            tools=tools,
            tool_choice=choice if tools else None,
            params=_sampling(gen),
            stream=_optional_bool(body, "stream") or False,
            requested_model=model,
            capture=capture,
            adapter_state=state,
            response_format=_response_format(body, capture),
            reasoning=_thinking_level(gen.get("thinking_level")),
        )

    def render_response(self, completion: Completion, request: NormalizedRequest) -> dict[str, Any]:
        """As the API answers a create: only the output steps (a GET adds the input's)."""
        return interaction(completion, request, output_steps(completion, request))

    def render_stream(self, completion: Completion, request: NormalizedRequest) -> list[bytes]:
        return stream_frames(completion, request)

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        message = error.message
        if isinstance(error, ContextLengthExceeded):
            message = (
                f"The input token count ({error.prompt_tokens}) exceeds the maximum number of "
                f"tokens allowed ({error.limit})."
            )
        code = _ERROR_CODES.get(
            error.status, "api_error" if error.status >= 500 else "invalid_request"
        )
        return {"error": {"code": code, "message": message}}

    def stream_error(self, error: GatewayError) -> bytes:
        return sse({"event_type": "error", **self.error_body(error)})

    # -- stored interactions (previous_interaction_id, GET/DELETE /interactions/{id})

    def reply_id(self, ctx: RequestContext) -> str:
        """The id a GET or DELETE names. What a GET cannot be answered with here is refused by
        name: a cancel (nothing runs in the background), a stream replay, ``include_input``
        (the stored steps already start with the input's)."""
        match = _PATH_RE.match(unquote(ctx.path).rstrip("/"))
        assert match is not None and match.group(1) is not None  # operation() matched it
        if match.group(2) is not None:
            raise InvalidRequest(
                "cancel applies to background interactions; this gateway runs none (every "
                "interaction completes before its reply)"
            )
        for name in ("stream", "last_event_id"):
            if ctx.query.get(name) not in (None, "", "false"):
                raise InvalidRequest(
                    f"{name}: a stored interaction is fetched whole here, not streamed again"
                )
        if ctx.query.get("include_input") not in (None, "", "false"):
            raise InvalidRequest(
                "include_input: a stored interaction's steps already start with its user_input "
                "steps; fetch it without include_input"
            )
        return match.group(1)

    def reply_to_store(
        self, completion: Completion, request: NormalizedRequest, *, always: bool = False
    ) -> tuple[str, dict[str, Any]] | None:
        """The whole timeline, as a GET returns it: the input's steps, then the output's."""
        state = interactions_state(request)
        if not (always or state.store):
            return None
        steps = [*state.input_steps, *output_steps(completion, request)]
        return interaction_id(completion), interaction(completion, request, steps)

    def continues(self, request: NormalizedRequest) -> str | None:
        return interactions_state(request).previous_interaction_id

    def continue_after(
        self, request: NormalizedRequest, context: list[Message], stored: dict[str, Any]
    ) -> None:
        """The kept interaction's messages, then this call's; its ``system_instruction`` is not
        carried over (this call's own, if any, leads)."""
        earlier = list(context)
        if (
            earlier
            and earlier[0].get("role") == "system"
            and earlier[0].get("content") == stored.get("system_instruction")
        ):
            earlier.pop(0)
        own = list(request.messages)
        lead = [own.pop(0)] if own and own[0].get("role") == "system" else []
        request.messages = lead + earlier + own

    def deleted(self, reply_id: str) -> dict[str, Any]:
        return {}

    def not_found(self, reply_id: str, *, continued: bool) -> GatewayError:
        if continued:
            return InvalidRequest(f"Previous interaction with id '{reply_id}' not found.")
        return NotFound(f"Interaction with id '{reply_id}' not found.")


# --------------------------------------------------------------------------- request: fields


def _check_revision(headers: Mapping[str, str]) -> None:
    revision = headers.get("api-revision")
    if revision and revision < _REVISION:
        raise InvalidRequest(
            f"Api-Revision {revision}: the legacy outputs schema is not served here; this "
            f"gateway speaks the steps schema (Api-Revision {_REVISION} or later)"
        )


def _refuse_unknown(obj: Mapping[str, Any], known: frozenset[str], prefix: str) -> None:
    unknown = sorted(key for key in obj if key not in known)
    if unknown:
        raise InvalidRequest(f"Unknown parameter: {prefix}{unknown[0]}")


def _refuse_google_side(body: Mapping[str, Any], capture: CaptureTags) -> None:
    for name, why in _GOOGLE_SIDE.items():
        if body.get(name) is not None:
            capture.feature(name, "refused")
            raise InvalidRequest(f"{name} is not supported: {why}")
    if _optional_bool(body, "background"):
        capture.feature("background", "refused")
        raise InvalidRequest(
            "background is not supported: every interaction here completes before its "
            "reply; stream it instead"
        )
    if body.get("cached_content") is not None:
        cached = _optional_str(body, "cached_content")
        capture.feature("cached_content", "refused")
        raise NotFound(
            f"cached_content {cached!r} not found: this gateway serves no cachedContents; send the "
            "cached contents in input and system_instruction instead"
        )


def _check_accepted(
    body: Mapping[str, Any], capture: CaptureTags, state: InteractionsState
) -> None:
    """The fields that change nothing here, each checked and put on the record by name."""
    if body.get("labels") is not None:
        labels = require_dict(body["labels"], "labels")
        if not all(isinstance(v, str) for v in labels.values()):
            raise InvalidRequest("labels values must be strings")
        capture.feature("labels", "honoured")
    modalities = require_list(body.get("response_modalities"), "response_modalities")
    if modalities:
        if any(not isinstance(m, str) or m.lower() != "text" for m in modalities):
            capture.feature("response_modalities", "refused")
            raise InvalidRequest(
                "response_modalities: the engines here answer with text only; ask for text"
            )
        capture.feature("response_modalities", "honoured")
    settings = require_list(body.get("safety_settings"), "safety_settings")
    for setting in settings:
        threshold = require_dict(setting, "safety_settings[]").get("threshold")
        if not isinstance(threshold, str) or threshold.lower() not in _SAFE_THRESHOLDS:
            capture.feature("safety_settings", "refused")
            raise InvalidRequest(
                f"safety_settings threshold {threshold!r}: this gateway filters nothing, so "
                "only 'off' and 'block_none' are honoured"
            )
    if settings:
        capture.feature("safety_settings", "honoured")
    if body.get("service_tier") is not None:
        tier = _optional_str(body, "service_tier")
        capture.feature("service_tier", "mapped")
        capture.notes.append(f"service_tier {tier}: one service tier here (standard)")
        state.echo["service_tier"] = "standard"


def _model(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequest("model is required (a model name)")
    return value.removeprefix("models/")


def _optional_str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"{key} must be a string")
    return value


def _optional_bool(body: Mapping[str, Any], key: str) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest(f"{key} must be a boolean")
    return value


def _tools(raw: Any, capture: CaptureTags) -> list[Tool]:
    """Function tools; a built-in tool (google_search, code_execution, url_context, mcp_server,
    ...) runs inside Google's service: refused by name, never dropped."""
    tools: list[Tool] = []
    for index, entry in enumerate(require_list(raw, "tools")):
        entry = require_dict(entry, f"tools[{index}]")
        kind = entry.get("type")
        if kind != "function":
            capture.feature(f"tool {kind}", "refused")
            raise InvalidRequest(
                f"tools[{index}]: the built-in tool {kind!r} runs inside Google's service and is "
                "not available here; declare a function instead"
            )
        tools.append(_function_tool(entry, f"tools[{index}]", capture))
    return tools


def _function_tool(entry: dict[str, Any], where: str, capture: CaptureTags) -> Tool:
    _refuse_unknown(
        entry,
        frozenset(
            {"type", "name", "description", "parameters", "short_description", "defer_loading"}
        ),
        f"{where}.",
    )
    if _optional_bool(entry, "defer_loading"):
        capture.feature("defer_loading", "refused")
        raise InvalidRequest(
            f"{where}.defer_loading: tool search runs inside Google's service; declare the "
            "function without defer_loading"
        )
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{where}.name is required")
    function: dict[str, Any] = {"name": name}
    # short_description is what tool search lists; without it every tool is loaded whole, so
    # the description stands, and a tool with only the short one is described by it.
    description = _optional_str(entry, "description") or _optional_str(entry, "short_description")
    if description:
        function["description"] = description
    parameters = entry.get("parameters")
    function["parameters"] = (
        {"type": "object", "properties": {}}
        if parameters is None
        else require_dict(parameters, f"{where}.parameters")
    )
    return {"type": "function", "function": function}


def _generation_config(raw: Any, capture: CaptureTags) -> dict[str, Any]:
    if raw is None:
        return {}
    gen = require_dict(raw, "generation_config")
    _refuse_unknown(gen, _GENERATION_FIELDS, "generation_config.")
    for name in _MEDIA_CONFIGS:
        if gen.get(name) is not None:
            capture.feature(f"generation_config.{name}", "refused")
            raise InvalidRequest(
                f"generation_config.{name}: the engines here answer with text only"
            )
    return gen


def _sampling(gen: dict[str, Any]) -> SamplingParams:
    return SamplingParams(
        max_tokens=optional_number(gen, "max_output_tokens", int),
        temperature=optional_number(gen, "temperature"),
        top_p=optional_number(gen, "top_p"),
        stop=stop_list(gen.get("stop_sequences")),
        seed=optional_number(gen, "seed", int),
    )


def _thinking_level(value: Any) -> ReasoningControls:
    """``thinking_level``: the reasoning effort (minimal and low, high and xhigh share a level)."""
    if value is None:
        return ReasoningControls()
    if not isinstance(value, str) or value.lower() not in _THINKING_LEVELS:
        raise InvalidRequest(
            f"generation_config.thinking_level must be one of {', '.join(_THINKING_LEVELS)}"
        )
    return ReasoningControls(effort=effort("generation_config.thinking_level", value.lower()))


def _summaries(value: Any, capture: CaptureTags) -> bool:
    if value is None:
        return True
    if value not in ("auto", "none"):
        raise InvalidRequest("generation_config.thinking_summaries must be 'auto' or 'none'")
    capture.feature("generation_config.thinking_summaries", "honoured")
    return value == "auto"


def _tool_choice(raw: Any, tools: list[Tool]) -> Any:
    """``tool_choice``: ``any`` forces a call (to the one allowed function when it names one);
    allowing several but not all declared functions cannot be expressed to the engine, so it
    is refused by name rather than widened to every tool."""
    if raw is None:
        return None
    allowed: list[str] = []
    if isinstance(raw, str):
        mode: Any = raw
    else:
        config = require_dict(raw, "generation_config.tool_choice")
        _refuse_unknown(config, frozenset({"allowed_tools"}), "generation_config.tool_choice.")
        spec = require_dict(config.get("allowed_tools") or {}, "tool_choice.allowed_tools")
        _refuse_unknown(spec, frozenset({"mode", "tools"}), "tool_choice.allowed_tools.")
        mode = spec.get("mode") or "auto"
        allowed = require_list(spec.get("tools"), "tool_choice.allowed_tools.tools")
        if not all(isinstance(name, str) for name in allowed):
            raise InvalidRequest("tool_choice.allowed_tools.tools must be function names")
    choice = _TOOL_CHOICES.get(mode.lower()) if isinstance(mode, str) else None
    if choice is None:
        raise InvalidRequest("tool_choice must be 'auto', 'any', 'none' or 'validated'")
    if choice == "required" and len(allowed) == 1:
        return {"type": "function", "function": {"name": allowed[0]}}
    declared = {(tool.get("function") or {}).get("name") for tool in tools}
    if allowed and choice != "none" and set(allowed) != declared:
        raise InvalidRequest(
            "tool_choice.allowed_tools naming some but not all of the declared functions is not "
            "supported: name one (mode any) or declare only the allowed functions"
        )
    return choice


def _response_format(body: Mapping[str, Any], capture: CaptureTags) -> ResponseFormat | None:
    """``response_format`` (a text format, or a list holding one) with ``mime_type``
    ``application/json`` and a ``schema``, mapped to the engine's response_format; the legacy
    form (a bare JSON schema with ``response_mime_type: application/json``) too. Audio, image
    and video formats are refused by name."""
    raw = body.get("response_format")
    legacy_mime = _optional_str(body, "response_mime_type")
    if raw is None:
        if legacy_mime not in (None, "text/plain"):
            raise InvalidRequest(
                f"response_mime_type {legacy_mime!r} needs a response_format; send "
                "response_format {type: text, mime_type: application/json, schema}"
            )
        return None
    formats = raw if isinstance(raw, list) else [raw]
    chosen: ResponseFormat | None = None
    for index, entry in enumerate(formats):
        entry = require_dict(entry, f"response_format[{index}]")
        kind = entry.get("type")
        if kind in ("audio", "image", "video"):
            capture.feature(f"response_format {kind}", "refused")
            raise InvalidRequest(
                f"response_format type {kind!r}: the engines here answer with text only"
            )
        if kind == "text":
            _refuse_unknown(entry, frozenset({"type", "mime_type", "schema"}), "response_format.")
            chosen = _text_format(entry)
        elif legacy_mime == "application/json":
            chosen = ResponseFormat("json_schema", schema=entry)
        else:
            raise InvalidRequest(
                "response_format must be {type: text, mime_type: application/json, schema}"
            )
    if chosen is not None:
        capture.feature("structured_output", "mapped")
    return chosen


def _text_format(entry: dict[str, Any]) -> ResponseFormat | None:
    mime = entry.get("mime_type")
    schema = entry.get("schema")
    if mime in (None, "text/plain") and schema is None:
        return None
    if mime != "application/json":
        raise InvalidRequest(
            f"structured output: response_format mime_type {mime!r} is not supported with a "
            "schema (application/json)"
        )
    if schema is None:
        return ResponseFormat("json_object")
    return ResponseFormat("json_schema", schema=require_dict(schema, "response_format.schema"))
