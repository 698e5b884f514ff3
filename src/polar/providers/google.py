"""Google generateContent / streamGenerateContent (Gemini CLI, Pi in google-generative-ai mode).

Gemini quirks kept here:

* the model and the operation come from the URL (``.../models/{model}:streamGenerateContent``),
  and streaming is chosen by the URL, never by the body;
* the JS SDK sends camelCase keys, the Python SDK sometimes snake_case (``parameters_json_schema``),
  so structural keys are read in either spelling; user data (arguments, schemas' property names)
  is never renamed;
* function calls may lack ids: a missing id is derived from the call's position
  (``call_<turn>_<n>``) so it is the same on every replay, and a ``functionResponse`` is matched
  to its call by id, else by name in order; the ids made up are listed on the request
  (``made_up_call_ids``), so the gateway can put the model's own ids of the sampled turn in
  their place;
* ``thoughtSignature`` must be standard base64 (the Python SDK decodes it to bytes and re-encodes
  it), so our reasoning blob travels base64-wrapped;
* ``thinkingConfig``: ``thinkingBudget`` 0 switches reasoning off, any other budget on (a
  positive one is recorded by name: no engine here takes one), ``thinkingLevel`` is the effort,
  ``includeThoughts`` says whether thought parts come back (the signature always does, so
  history stays exact, and the record keeps the reasoning either way);
* built-in tools (``googleSearch``, ``codeExecution``, ``urlContext``, ...) run inside Google's
  service and ``cachedContent`` names contents cached there (the gateway serves no
  ``cachedContents``): both are refused by name, never dropped;
* a stream is bare ``data:`` frames, each a whole GenerateContentResponse; an error frame must
  start with ``{"error":`` for the SDK to raise it, and the keep-alive is a chunk whose
  candidate has no parts, not an SSE comment: google-genai parses every line that is not
  ``data:`` as JSON and raises UnknownApiResponseError on a comment.

The module reads better whole (about 645 lines): the quirks above tie its request parsing,
schema conversion and replies together, and none of them is shared with another API.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import unquote

import orjson

from polar.errors import ContextLengthExceeded, GatewayError, InvalidRequest, NotFound
from polar.providers.base import (
    COUNT_TOKENS,
    GENERATE,
    Provider,
    RequestContext,
    arguments_object,
    chat_content,
    join_text,
    optional_number,
    require_dict,
    require_list,
    sse,
    stop_list,
)
from polar.providers.logprobs import sampled_logprobs
from polar.providers.reasoning import effort, record_budget
from polar.providers.reasoning_codec import decode_reasoning_b64, encode_reasoning_b64
from polar.providers.routing import ProviderRouting
from polar.providers.types import (
    CaptureTags,
    Completion,
    Message,
    NormalizedRequest,
    ReasoningControls,
    ReasoningEffort,
    ReasoningSwitch,
    ResponseFormat,
    SamplingParams,
    Tool,
)

_OPERATIONS = {
    "generateContent": GENERATE,
    "streamGenerateContent": GENERATE,
    "countTokens": COUNT_TOKENS,
}
_METHOD_RE = re.compile(r":(generateContent|streamGenerateContent|countTokens)$")
# The model follows the first ``models/`` segment after an API version, else the first one at all
# (Vertex paths put projects/locations before it; model names may contain slashes).
_VERSIONED_MODEL_RE = re.compile(r"/v\d+(?:alpha|beta)?\d*/models/(.+)$")
_ANY_MODEL_RE = re.compile(r"(?:^|/)models/(.+)$")
_SNAKE_RE = re.compile(r"_([a-z0-9])")

_FINISH_REASONS = {
    "stop": "STOP",
    "length": "MAX_TOKENS",
    "tool_calls": "STOP",
    "content_filter": "SAFETY",
}
# A chunk with nothing in it, shaped like every other (consumers index candidates[0]).
_EMPTY_CHUNK = sse({"candidates": [{"content": {"role": "model", "parts": []}, "index": 0}]})
_ERROR_STATUS_BY_KIND = {
    "invalid_request": "INVALID_ARGUMENT",
    "authentication": "UNAUTHENTICATED",
    "not_found": "NOT_FOUND",
    "request_too_large": "INVALID_ARGUMENT",
    "rate_limit": "RESOURCE_EXHAUSTED",
    "engine_error": "INTERNAL",
    "overloaded": "UNAVAILABLE",
    "timeout": "DEADLINE_EXCEEDED",
}
_ERROR_STATUS_BY_CODE = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_TOOL_CHOICES = {"AUTO": "auto", "VALIDATED": "auto", "ANY": "required", "NONE": "none"}
# Schema keywords renamed on the way to JSON Schema; ``propertyOrdering`` has no equivalent.
_SCHEMA_RENAMES = {"defs": "$defs", "ref": "$ref"}
_SCHEMA_DROPPED = {"propertyOrdering", "nullable"}


@dataclass
class GoogleState:
    """What this adapter remembers between parsing a request and rendering its reply."""

    include_thoughts: bool = False  # thinkingConfig.includeThoughts: reasoning comes back as parts


def _state(request: NormalizedRequest) -> GoogleState:
    state = request.adapter_state
    return state if isinstance(state, GoogleState) else GoogleState()


class GoogleProvider(Provider):
    """The Gemini API's generateContent family."""

    name: ClassVar[str] = "google"
    routing: ClassVar[ProviderRouting] = ProviderRouting(
        client="google",
        api_roots=("/v1beta", "/v1alpha"),
        key_headers=("x-goog-api-key",),
        base_url_env=("GOOGLE_GEMINI_BASE_URL",),
        api_key_env=("GEMINI_API_KEY",),
    )

    def operation(self, ctx: RequestContext) -> str | None:
        method = _path_method(ctx.path)
        return _OPERATIONS[method] if method else None

    def matches_headers(self, headers: Mapping[str, str]) -> bool:
        return "x-goog-api-key" in headers

    def matches_body(self, body: Any) -> bool:
        return isinstance(body, dict) and "contents" in body

    def parse_request(self, body: Any, ctx: RequestContext) -> NormalizedRequest:
        body = _fields(require_dict(body))
        method = _path_method(ctx.path)
        if method == "countTokens" and body.get("generateContentRequest") is not None:
            body = _fields(require_dict(body["generateContentRequest"], "generateContentRequest"))
        model = _path_model(ctx.path) or _body_model(body.get("model"))
        capture = CaptureTags()
        _refuse_cached_content(body.get("cachedContent"), capture)
        system = _system_text(body.get("systemInstruction"))
        messages: list[Message] = [{"role": "system", "content": system}] if system else []
        made_up: set[str] = set()
        messages.extend(_messages(body.get("contents"), made_up))
        if not any(m["role"] != "system" for m in messages):
            raise InvalidRequest("contents must hold at least one message with parts")
        tools = _tools(body.get("tools"), capture)
        gen_raw = body.get("generationConfig")
        gen = {} if gen_raw is None else _fields(require_dict(gen_raw, "generationConfig"))
        state = GoogleState()
        reasoning = _thinking_config(gen.get("thinkingConfig"), state, capture)
        logprobs = _logprobs_asked(gen, capture)
        return NormalizedRequest(
            provider=self.name,
            model=model,
            messages=messages,
            tools=tools,
            tool_choice=_tool_choice(body.get("toolConfig"), tools) if tools else None,
            params=_sampling(gen),
            stream=method == "streamGenerateContent",
            requested_model=model,
            adapter_state=state,
            capture=capture,
            response_format=_response_format(gen, capture),
            logprobs=logprobs,
            made_up_call_ids=made_up,
            reasoning=reasoning,
        )

    def render_response(self, completion: Completion, request: NormalizedRequest) -> dict[str, Any]:
        parts = [p for group in _part_groups(completion, request) for p in group]
        return _chunk(completion, request, parts, final=True)

    def render_stream(self, completion: Completion, request: NormalizedRequest) -> list[bytes]:
        groups = _part_groups(completion, request)
        return [
            sse(_chunk(completion, request, group, final=i == len(groups) - 1))
            for i, group in enumerate(groups)
        ]

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        status = _ERROR_STATUS_BY_KIND.get(error.kind) or _ERROR_STATUS_BY_CODE.get(
            error.status, "INTERNAL"
        )
        message = error.message
        if isinstance(error, ContextLengthExceeded):
            message = (
                f"The input token count ({error.prompt_tokens}) exceeds the maximum number of "
                f"tokens allowed ({error.limit})."
            )
        return {"error": {"code": error.status, "message": message, "status": status}}

    def stream_error(self, error: GatewayError) -> bytes:
        return sse(self.error_body(error))

    def keep_alive(self) -> bytes:
        return _EMPTY_CHUNK

    def render_token_count(self, count: int) -> dict[str, Any]:
        return {"totalTokens": count}


# --- request side -------------------------------------------------------------------------------


def _path_method(path: str) -> str | None:
    match = _METHOD_RE.search(unquote(path))
    return match.group(1) if match else None


def _path_model(path: str) -> str:
    head = _METHOD_RE.sub("", unquote(path))
    match = _VERSIONED_MODEL_RE.search(head) or _ANY_MODEL_RE.search(head)
    return match.group(1) if match else ""


def _body_model(value: Any) -> str:
    if not isinstance(value, str):
        return ""
    return value.removeprefix("models/")


def _camel(key: str) -> str:
    return _SNAKE_RE.sub(lambda m: m.group(1).upper(), key)


def _fields(obj: dict[str, Any]) -> dict[str, Any]:
    """A structural object with snake_case keys read as camelCase (the camelCase key wins)."""
    out = {_camel(k): v for k, v in obj.items() if _camel(k) != k}
    out.update((k, v) for k, v in obj.items() if _camel(k) == k)
    return out


def _text_of(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{what} must be a string")
    return value


def _json_text(value: Any) -> str:
    """Compact JSON in the client's key order; integers beyond 64 bits still serialize."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _system_text(value: Any) -> str:
    """``systemInstruction`` as one string: a Content, a bare string, or a list of parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        value = _fields(value).get("parts")
    texts = []
    for raw in require_list(value, "systemInstruction.parts"):
        part = _part(raw, "systemInstruction.parts[]")
        if part.get("text") is not None:
            texts.append(_text_of(part["text"], "systemInstruction text"))
    return join_text(texts)


def _part(raw: Any, what: str) -> dict[str, Any]:
    if isinstance(raw, str):
        return {"text": raw}
    return _fields(require_dict(raw, what))


def _messages(contents: Any, made_up: set[str]) -> list[Message]:
    """The chat messages of ``contents``; every call id made up for want of one is added to
    ``made_up``."""
    if contents is None:
        raise InvalidRequest("contents is required")
    messages: list[Message] = []
    pending: list[_PendingCall] = []  # the latest model turn's calls
    for turn, raw in enumerate(require_list(contents, "contents")):
        content = _fields(require_dict(raw, "contents[]"))
        role = content.get("role") or "user"
        parts = [
            _part(p, "contents[].parts[]") for p in require_list(content.get("parts"), "parts")
        ]
        if role == "model":
            message, calls = _model_message(parts, turn, made_up)
            pending = [_PendingCall(c["id"], c["function"]["name"]) for c in calls]
            if message is not None:
                messages.append(message)
        elif role in ("user", "function"):
            messages.extend(_user_messages(parts, turn, pending, made_up))
        else:
            raise InvalidRequest(f"contents[].role must be 'user' or 'model', not {role!r}")
    return messages


@dataclass
class _PendingCall:
    """A function call of the latest model turn, awaiting its functionResponse."""

    id: str
    name: str
    answered: bool = False


def _model_message(
    parts: list[dict[str, Any]], turn: int, made_up: set[str]
) -> tuple[Message | None, list[Any]]:
    """An assistant message (text, tool calls, reasoning) from one model Content."""
    chunks: list[dict[str, Any]] = []
    thoughts: list[str] = []
    signed: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in parts:
        sig = decode_reasoning_b64(part.get("thoughtSignature"))
        if sig is not None and sig not in signed:
            signed.append(sig)
        if part.get("thought") is True and part.get("text") is not None:
            thoughts.append(_text_of(part["text"], "thought text"))
        elif part.get("functionCall") is not None:
            calls.append(_function_call(part["functionCall"], turn, len(calls), made_up))
        else:
            chunks.extend(_content_parts(part))
    if not (chunks or calls or thoughts or signed):
        return None, calls
    message: Message = {"role": "assistant", "content": chat_content(chunks)}
    reasoning = join_text(thoughts) if thoughts else join_text(signed)
    if reasoning:
        message["reasoning"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message, calls


def _function_call(raw: Any, turn: int, index: int, made_up: set[str]) -> dict[str, Any]:
    call = _fields(require_dict(raw, "functionCall"))
    name = _text_of(call.get("name"), "functionCall.name")
    call_id = call.get("id")
    if call_id is None or call_id == "":
        call_id = f"call_{turn}_{index}"
        made_up.add(call_id)
    args = call.get("args")
    if args is None:
        arguments = "{}"
    elif isinstance(args, dict):
        arguments = _json_text(args)
    else:
        raise InvalidRequest("functionCall.args must be an object")
    return {
        "id": _text_of(call_id, "functionCall.id"),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _user_messages(
    parts: list[dict[str, Any]], turn: int, pending: list[_PendingCall], made_up: set[str]
) -> list[Message]:
    """Tool results first (they must follow the assistant turn), then the user's own parts."""
    results: list[Message] = []
    chunks: list[dict[str, Any]] = []
    for part in parts:
        if part.get("functionResponse") is not None:
            response = _fields(require_dict(part["functionResponse"], "functionResponse"))
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": _match_call(response, pending, turn, len(results), made_up),
                    "content": _json_text(response.get("response", {})),
                }
            )
        else:
            chunks.extend(_content_parts(part))
    if chunks:
        results.append({"role": "user", "content": chat_content(chunks)})
    return results


def _match_call(
    response: dict[str, Any], pending: list[_PendingCall], turn: int, index: int, made_up: set[str]
) -> str:
    """The id of the call a functionResponse answers: by id, else by name in order."""
    name = _text_of(response.get("name"), "functionResponse.name")
    given = response.get("id")
    if given is not None and not isinstance(given, str):
        raise InvalidRequest("functionResponse.id must be a string")
    open_calls = [c for c in pending if not c.answered]
    match = next((c for c in open_calls if given and c.id == given), None) or next(
        (c for c in open_calls if c.name == name), None
    )
    if match is None:
        if given:
            return given
        made_up.add(f"call_{turn}_{index}")
        return f"call_{turn}_{index}"
    match.answered = True
    return match.id


def _content_parts(part: dict[str, Any]) -> list[dict[str, Any]]:
    """Chat content parts for one Gemini part that is neither a call nor a result."""
    if part.get("text") is not None:
        return [{"type": "text", "text": _text_of(part["text"], "text")}]
    if part.get("inlineData") is not None:
        data = _fields(require_dict(part["inlineData"], "inlineData"))
        mime = _text_of(data.get("mimeType") or "application/octet-stream", "inlineData.mimeType")
        url = f"data:{mime};base64,{_text_of(data.get('data'), 'inlineData.data')}"
        return [{"type": "image_url", "image_url": {"url": url}}]
    if part.get("fileData") is not None:
        data = _fields(require_dict(part["fileData"], "fileData"))
        url = _text_of(data.get("fileUri"), "fileData.fileUri")
        return [{"type": "image_url", "image_url": {"url": url}}]
    if part.get("executableCode") is not None:
        code = _fields(require_dict(part["executableCode"], "executableCode"))
        language = _text_of(code.get("language") or "", "executableCode.language").lower()
        text = f"```{language}\n{_text_of(code.get('code', ''), 'executableCode.code')}\n```"
        return [{"type": "text", "text": text}]
    if part.get("codeExecutionResult") is not None:
        result = _fields(require_dict(part["codeExecutionResult"], "codeExecutionResult"))
        output = _text_of(result.get("output", ""), "codeExecutionResult.output")
        return [{"type": "text", "text": output}]
    return []


def _tools(raw: Any, capture: CaptureTags) -> list[Tool]:
    """Function declarations; a built-in tool (googleSearch, codeExecution, urlContext, ...)
    runs inside Google's service: refused by name, never dropped."""
    tools: list[Tool] = []
    for entry in require_list(raw, "tools"):
        for key, value in _fields(require_dict(entry, "tools[]")).items():
            if key == "functionDeclarations":
                tools.extend(_function_tool(d) for d in require_list(value, key))
            elif value is not None:
                capture.feature(f"tool {key}", "refused")
                raise InvalidRequest(
                    f"tools[].{key}: the built-in tool {key!r} runs inside Google's service and "
                    "is not available here; declare a function instead"
                )
    return tools


def _refuse_cached_content(value: Any, capture: CaptureTags) -> None:
    """``cachedContent`` names contents cached in Google's service; the gateway serves no
    ``cachedContents``, so no name is known to it: refused by name, never ignored."""
    if value is None:
        return
    name = _text_of(value, "cachedContent")
    capture.feature("cachedContent", "refused")
    raise NotFound(
        f"cachedContent {name!r} not found: this gateway serves no cachedContents; send the "
        "cached contents in contents and systemInstruction instead"
    )


_THINKING_LEVELS = {"MINIMAL": "minimal", "LOW": "low", "MEDIUM": "medium", "HIGH": "high"}


def _thinking_config(raw: Any, state: GoogleState, capture: CaptureTags) -> ReasoningControls:
    """``thinkingConfig``: ``thinkingBudget`` 0 is the switch off, -1 (dynamic) or a budget
    on (the budget recorded by name), ``thinkingLevel`` the effort, ``includeThoughts``
    whether thought parts come back."""
    if raw is None:
        return ReasoningControls()
    config = _fields(require_dict(raw, "generationConfig.thinkingConfig"))
    include = config.get("includeThoughts")
    if include is not None:
        if not isinstance(include, bool):
            raise InvalidRequest("thinkingConfig.includeThoughts must be a boolean")
        state.include_thoughts = include
        capture.feature("thinkingConfig.includeThoughts", "honoured")
    switch: ReasoningSwitch | None = None
    budget = optional_number(config, "thinkingBudget", int)
    if budget is not None:
        if budget < -1:
            raise InvalidRequest("thinkingConfig.thinkingBudget must be -1, 0 or positive")
        switch = ReasoningSwitch(f"thinkingConfig.thinkingBudget {budget}", on=budget != 0)
        if budget > 0:
            record_budget(capture, "thinkingConfig.thinkingBudget", budget)
    level = config.get("thinkingLevel")
    chosen: ReasoningEffort | None = None
    if level is not None:
        word = _text_of(level, "thinkingConfig.thinkingLevel").upper()
        if word not in (*_THINKING_LEVELS, "THINKING_LEVEL_UNSPECIFIED"):
            raise InvalidRequest(
                "thinkingConfig.thinkingLevel must be MINIMAL, LOW, MEDIUM or HIGH"
            )
        if word in _THINKING_LEVELS:
            chosen = effort("thinkingConfig.thinkingLevel", _THINKING_LEVELS[word])
    return ReasoningControls(switch=switch, effort=chosen)


def _function_tool(raw: Any) -> Tool:
    decl = _fields(require_dict(raw, "functionDeclarations[]"))
    function: dict[str, Any] = {"name": _text_of(decl.get("name"), "functionDeclaration.name")}
    if decl.get("description") is not None:
        function["description"] = _text_of(decl["description"], "functionDeclaration.description")
    if decl.get("parametersJsonSchema") is not None:
        parameters = require_dict(decl["parametersJsonSchema"], "parametersJsonSchema")
    elif decl.get("parameters") is not None:
        parameters = _json_schema(decl["parameters"])
    else:
        parameters = {"type": "object", "properties": {}}
    function["parameters"] = parameters
    return {"type": "function", "function": function}


def _json_schema(raw: Any) -> dict[str, Any]:
    """A Gemini OpenAPI-style Schema (``type: "OBJECT"``, ``nullable``) as JSON Schema."""
    schema = _fields(require_dict(raw, "schema"))
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_DROPPED:
            continue
        name = _SCHEMA_RENAMES.get(key, key)
        if key == "type":
            if not isinstance(value, str):
                raise InvalidRequest("schema type must be a string")
            if value.upper() != "TYPE_UNSPECIFIED":
                out[name] = value.lower()
        elif key in ("properties", "defs"):
            props = require_dict(value, f"schema {key}")
            out[name] = {prop: _json_schema(sub) for prop, sub in props.items()}
        elif key == "items" or (key == "additionalProperties" and isinstance(value, dict)):
            out[name] = _json_schema(value)
        elif key == "anyOf":
            out[name] = [_json_schema(sub) for sub in require_list(value, "schema anyOf")]
        else:
            out[name] = value
    if schema.get("nullable") is True and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def _tool_choice(raw: Any, tools: list[dict[str, Any]]) -> Any:
    """``functionCallingConfig``: mode ANY forces a call (to the one allowed function when it
    names one); allowing several but not all declared functions cannot be expressed to the
    engine, so it is refused by name rather than widened to every tool."""
    if raw is None:
        return None
    config = _fields(require_dict(raw, "toolConfig")).get("functionCallingConfig")
    if config is None:
        return None
    config = _fields(require_dict(config, "functionCallingConfig"))
    mode = config.get("mode")
    if mode is None:
        return None
    choice = _TOOL_CHOICES.get(_text_of(mode, "functionCallingConfig.mode").upper())
    allowed = [
        _text_of(name, "allowedFunctionNames[]")
        for name in require_list(config.get("allowedFunctionNames"), "allowedFunctionNames")
    ]
    if choice == "required" and len(allowed) == 1:
        return {"type": "function", "function": {"name": allowed[0]}}
    declared = {(tool.get("function") or {}).get("name") for tool in tools}
    if allowed and choice != "none" and set(allowed) != declared:
        raise InvalidRequest(
            "functionCallingConfig.allowedFunctionNames naming some but not all of the "
            "declared functions is not supported: name one (mode ANY) or declare only the "
            "allowed functions"
        )
    return choice


def _response_format(gen: dict[str, Any], capture: CaptureTags) -> ResponseFormat | None:
    """``responseMimeType: application/json`` with ``responseJsonSchema`` (JSON Schema) or
    ``responseSchema`` (Gemini's OpenAPI subset), mapped to the engine's response_format;
    other constrained types (``text/x.enum``) are a 400 naming structured output."""
    mime = gen.get("responseMimeType")
    json_schema = gen.get("responseJsonSchema", gen.get("_responseJsonSchema"))
    schema = gen.get("responseSchema")
    if mime in (None, "text/plain") and json_schema is None and schema is None:
        return None
    if mime != "application/json":
        raise InvalidRequest(
            f"structured output: responseMimeType {mime!r} is not supported with a response "
            "schema (application/json)"
        )
    capture.feature("structured_output", "mapped")
    if json_schema is not None:
        return ResponseFormat(
            "json_schema", schema=require_dict(json_schema, "generationConfig.responseJsonSchema")
        )
    if schema is not None:
        return ResponseFormat("json_schema", schema=_json_schema(schema))
    return ResponseFormat("json_object")


def _logprobs_asked(gen: dict[str, Any], capture: CaptureTags) -> bool:
    return sampled_logprobs(
        gen.get("responseLogprobs"),
        optional_number(gen, "logprobs", int),
        capture,
        field="generationConfig.responseLogprobs",
        top_field="generationConfig.logprobs (top candidates)",
        instead="use responseLogprobs: true alone",
    )


def _logprobs_result(completion: Completion) -> dict[str, Any]:
    chosen = [{"token": t.token, "logProbability": t.logprob} for t in completion.logprobs or ()]
    return {"chosenCandidates": chosen, "topCandidates": []}


def _sampling(gen: dict[str, Any]) -> SamplingParams:
    count = optional_number(gen, "candidateCount", int)
    if count not in (None, 1):
        raise InvalidRequest("candidateCount must be 1: the gateway samples one candidate")
    return SamplingParams(
        max_tokens=optional_number(gen, "maxOutputTokens", int),
        temperature=optional_number(gen, "temperature"),
        top_p=optional_number(gen, "topP"),
        top_k=optional_number(gen, "topK", int),
        stop=stop_list(gen.get("stopSequences")),
        seed=optional_number(gen, "seed", int),
        presence_penalty=optional_number(gen, "presencePenalty"),
        frequency_penalty=optional_number(gen, "frequencyPenalty"),
    )


# --- response side ------------------------------------------------------------------------------


def _part_groups(completion: Completion, request: NormalizedRequest) -> list[list[dict[str, Any]]]:
    """The reply's parts, grouped as streamed: thought, text, then every function call at once.

    The signature rides on the first function call, else on the last non-thought part, since
    Gemini clients drop thought parts from history but keep signatures.
    """
    thought: list[dict[str, Any]] = []
    if completion.reasoning and _state(request).include_thoughts:
        thought = [{"text": completion.reasoning, "thought": True}]
    text: list[dict[str, Any]] = [{"text": completion.content}] if completion.content else []
    calls: list[dict[str, Any]] = [
        {"functionCall": {"id": c.id, "name": c.name, "args": arguments_object(c.arguments)}}
        for c in completion.tool_calls
    ]
    if not (text or calls):
        text = [{"text": ""}]
    if completion.reasoning:
        (calls or text)[0]["thoughtSignature"] = encode_reasoning_b64(completion.reasoning)
    return [group for group in (thought, text, calls) if group]


def _chunk(
    completion: Completion, request: NormalizedRequest, parts: list[dict[str, Any]], *, final: bool
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    reply: dict[str, Any] = {"candidates": [candidate]}
    if final:
        candidate["finishReason"] = _FINISH_REASONS.get(completion.finish_reason, "STOP")
        if request.logprobs:
            result = _logprobs_result(completion)
            candidate["logprobsResult"] = result
            chosen = [c["logProbability"] for c in result["chosenCandidates"]]
            if chosen:
                candidate["avgLogprobs"] = sum(chosen) / len(chosen)
        reply["usageMetadata"] = {
            "promptTokenCount": completion.prompt_tokens,
            "candidatesTokenCount": completion.completion_tokens,
            "totalTokenCount": completion.prompt_tokens + completion.completion_tokens,
        }
    reply["modelVersion"] = request.requested_model or completion.model
    reply["responseId"] = completion.id
    return reply
