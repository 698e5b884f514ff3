"""``polar check-engine``'s probe: is a user's own engine served faithfully through Polar?

A gateway (gateway-side rendering) is put in front of the engine in process, with a recording
transport between them that keeps what the engine itself reports for every call. Then:

* **family**: which model family the gateway picked for the served tokenizer;
* **parity**: fixed conversations rendered whole by the gateway must be token-identical to the
  engine's own chat rendering of the same messages (its ``/tokenize``), so a policy trains on
  the prompts it will see when deployed;
* **exactness**: a few multi-turn tool sessions are driven like a harness drives them (replies
  fed back with arguments re-serialized, tool results and user turns added). Every capture must
  equal what the engine reported (prompt ids, sampled ids, logprobs), every whole-rendered
  prompt must equal the engine's ``/tokenize`` of the same messages, and every call a
  prefix-merged trace claims must have seen exactly the trace's context.

Any mismatch makes :attr:`EngineCheck.ok` false (the command then exits 1), and so does a run
that never exercised what it would vouch for: no tool call, or no merged call
(:attr:`EngineCheck.unexercised` names which). A weak or random model rarely calls a tool on its
own; ``force_tools`` sends ``tool_choice`` (``required``, then the bash function by name, in
turn) so that the engine's structured output makes it call, and the next turn is spliced onto
the call it sampled.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from polar.capture.records import CaptureRecord
from polar.capture.store import CaptureStore
from polar.engines.vllm import VLLMEngine
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.services import app_services
from polar.providers.types import NormalizedRequest
from polar.rendering.turns import TurnBook
from polar.schemas.flags import FLAG_RENDERED_WHOLE
from polar.schemas.sampling import SamplingPolicy
from polar.trajectory.prefix_merging import PrefixMergingBuilder

BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
SYSTEM = (
    "You are a coding agent. To run a shell command, call the bash tool. "
    "Call a tool whenever it helps."
)
TASKS = (
    "List the files in the current directory with the bash tool.",
    "Use bash to print the date, then tell me the year.",
    "Create a file named notes.txt with bash and show its contents.",
)


def _call(call_id: str, command: str) -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    return {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": arguments}}


# Conversations whose whole rendering must equal the engine's (tools: with the bash tool).
PARITY_CASES: dict[str, tuple[list[dict[str, Any]], bool]] = {
    "user only": ([{"role": "user", "content": "Name a prime number."}], False),
    "system + turns": (
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a prime number."},
            {"role": "assistant", "content": "7"},
            {"role": "user", "content": "A larger one?"},
        ],
        False,
    ),
    "tools": ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASKS[0]}], True),
    "tool call + result": (
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": TASKS[0]},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "notes.txt\nsrc"},
        ],
        True,
    ),
    "reasoning, calls, user turns": (
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": TASKS[0]},
            {
                "role": "assistant",
                "content": "",
                "reasoning": "I should list the files first.",
                "tool_calls": [_call("call_1", "ls")],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "notes.txt"},
            {"role": "assistant", "content": "One file: notes.txt.", "reasoning": "Just one."},
            {"role": "user", "content": TASKS[2]},
        ],
        True,
    ),
}
# Only for a family whose format holds several calls in one turn (Llama 3's refuses them).
PARALLEL_CASE: tuple[list[dict[str, Any]], bool] = (
    [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": TASKS[1]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call("call_1", "date"), _call("call_2", "date +%Y")],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Mon Nov 30 2026"},
        {"role": "tool", "tool_call_id": "call_2", "content": "2026"},
        {"role": "user", "content": "And the month?"},
    ],
    True,
)


@dataclass
class ParityRow:
    """One conversation rendered by the gateway and by the engine."""

    case: str
    gateway_tokens: int
    engine_tokens: int
    first_difference: int | None = None  # the first position where the ids differ
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.first_difference is None


@dataclass
class SessionRow:
    """One driven tool session and how exactly it was captured and merged."""

    task: str
    calls: int = 0
    tool_calls: int = 0
    forced_calls: int = 0  # calls sent with tool_choice required or named
    exact_captures: int = 0
    whole_prompts: int = 0
    whole_exact: int = 0
    merged_calls: int = 0
    exact_contexts: int = 0
    traces: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and self.calls > 0
            and self.exact_captures == self.calls
            and self.whole_exact == self.whole_prompts
            and self.exact_contexts == self.merged_calls
        )


@dataclass
class EngineCheck:
    """What the probe found; :attr:`ok` is false on any mismatch."""

    url: str
    model: str | None
    family: str | None
    render_mode: str
    parity: list[ParityRow] = field(default_factory=list)
    sessions: list[SessionRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Why ``force_tools`` could not force calls (the family has no call pattern), if it could not.
    unforceable: str | None = None
    engine_reasoning_parser: str | None = None  # as the gateway was told of it

    @property
    def unexercised(self) -> list[str]:
        """What the sessions never did, so the check cannot vouch for it."""
        gaps = []
        if self.unforceable is not None:
            gaps.append(f"forced tool calls were not sent: {self.unforceable}")
        if self.sessions and not any(row.tool_calls for row in self.sessions):
            gaps.append("no tool call was made: the tool-call path was not exercised")
        if self.sessions and not any(row.merged_calls for row in self.sessions):
            gaps.append("no call was merged onto an earlier one: splices were not exercised")
        return gaps

    @property
    def ok(self) -> bool:
        return (
            self.render_mode == "gateway"
            and bool(self.parity)
            and bool(self.sessions)
            and all(row.ok for row in self.parity)
            and all(row.ok for row in self.sessions)
            and not self.unexercised
        )


@dataclass
class Exchange:
    """One engine call as the engine answered it."""

    body: dict[str, Any]
    reply: dict[str, Any]


class RecordingTransport(httpx.AsyncBaseTransport):
    """Passes every request on and keeps each successful completion's body and reply: the
    engine's own account of what it conditioned on, independent of the gateway's capture."""

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self.inner = inner or httpx.AsyncHTTPTransport()
        self.exchanges: list[Exchange] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if not request.url.path.endswith("completions"):
            return response
        content = await response.aread()
        if response.status_code == 200:
            self.exchanges.append(Exchange(json.loads(request.content), json.loads(content)))
        return httpx.Response(
            response.status_code, headers=response.headers, content=content, request=request
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


def engine_tokens(exchange: Exchange) -> tuple[list[int], list[int], list[float] | None]:
    """(prompt ids, sampled ids, logprobs) as the engine reported them, in vLLM's shapes."""
    reply = exchange.reply
    choice = reply["choices"][0]
    prompt = choice.get("prompt_token_ids") or reply.get("prompt_token_ids") or []
    logprobs = choice.get("logprobs") or {}
    if "token_logprobs" in logprobs:
        values = logprobs["token_logprobs"]
    else:
        values = [entry["logprob"] for entry in logprobs.get("content") or []] or None
    return list(prompt), list(choice.get("token_ids") or []), values


async def check_engine(
    url: str,
    *,
    model: str | None = None,
    tokenizer: str | None = None,
    chat_template: str | None = None,
    family: str | None = None,
    tool_parser: str | None = None,
    sessions: int = 3,
    turns: int = 4,
    max_tokens: int = 96,
    force_tools: bool = False,
    engine_reasoning_parser: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> EngineCheck:
    """Probe the engine at ``url`` (the server root, without ``/v1``); see the module doc.
    ``engine_reasoning_parser``: the engine's (vLLM ``--reasoning-parser``), as a gateway in
    front of it is told (forced calls' grammar then starts after the reasoning)."""
    tap = RecordingTransport(transport)
    engine = VLLMEngine(url.rstrip("/"), transport=tap)
    with tempfile.TemporaryDirectory(prefix="polar-check-engine-") as workdir:
        db = Path(workdir) / "captures.db"
        store = CaptureStore(db)
        config = GatewayConfig(
            capture_db=db,
            auto_register=True,
            served_model=model,
            render={
                "mode": "gateway",
                "tokenizer": tokenizer,
                "chat_template": chat_template,
                "family": family,
                "tool_parser": tool_parser,
                "engine_reasoning_parser": engine_reasoning_parser,
            },
            sampling=SamplingPolicy(temperature=1.0, top_p=1.0),
        )
        app = create_app(config, engine=engine, store=store)
        try:
            check = await _probe(app, tap, url, sessions, turns, max_tokens, force_tools)
            check.engine_reasoning_parser = engine_reasoning_parser
            return check
        finally:
            await engine.aclose()
            store.close()


async def _probe(
    app: Any,
    tap: RecordingTransport,
    url: str,
    sessions: int,
    turns: int,
    max_tokens: int,
    force_tools: bool,
) -> EngineCheck:
    services = app_services(app)
    facts = await services.proxy.facts()
    renderer = facts.renderer
    family = renderer.family.name if renderer is not None else None
    if family == "tokenizer" and renderer is not None:  # no family: a parser named by hand
        family = f"(none: the tokenizer's template, parser {type(renderer.parser).__name__})"
    check = EngineCheck(url, facts.served_model, family, facts.render_mode, notes=facts.notes)
    if renderer is None:
        return check
    model = facts.served_model or ""
    if force_tools and renderer.family.call_pattern([BASH_TOOL["function"]], False) is None:
        # The gateway refuses a forcing tool_choice it cannot turn into a constraint: the
        # sessions run with tool_choice auto, and the check says forcing was not exercised.
        check.unforceable = (
            f"the {renderer.family.name!r} call format has no call pattern to force "
            "(docs/engines.md)"
        )
        force_tools = False
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=120) as raw:
        cases = dict(PARITY_CASES)
        if renderer.family.features.parallel_tool_calls:
            cases["parallel calls + results"] = PARALLEL_CASE
        for case, (messages, with_tools) in cases.items():
            tools = [BASH_TOOL] if with_tools else []
            request = NormalizedRequest(
                provider="openai_chat", model=model, messages=messages, tools=tools
            )
            ids = renderer.plan(TurnBook(1), request).ids
            check.parity.append(await _parity(raw, model, case, ids, messages, tools))
        gateway = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=600
        )
        async with gateway:
            for index in range(sessions):
                key = f"check-{index}"
                task = TASKS[index % len(TASKS)]
                row = SessionRow(task)
                start = len(tap.exchanges)
                try:
                    row.forced_calls = await drive(
                        gateway, key, task, turns, max_tokens, force_tools
                    )
                except (httpx.HTTPError, RuntimeError) as exc:
                    row.error = str(exc)
                # Sessions run one after another, calls in order: the engine's answers since
                # ``start`` are this session's calls, one for one.
                answered = tap.exchanges[start:]
                await score_session(row, services.store.records(key), answered, raw, model)
                check.sessions.append(row)
    return check


async def _parity(
    raw: httpx.AsyncClient,
    model: str,
    case: str,
    ids: list[int],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
) -> ParityRow:
    try:
        theirs = await engine_rendering(raw, model, messages, tools)
    except (httpx.HTTPError, RuntimeError) as exc:
        return ParityRow(case, len(ids), 0, error=str(exc))
    return ParityRow(case, len(ids), len(theirs), first_difference(ids, theirs))


async def engine_rendering(
    raw: httpx.AsyncClient,
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> list[int]:
    """The engine's own chat rendering of ``messages`` (vLLM's ``/tokenize`` with messages)."""
    body: dict[str, Any] = {"model": model, "messages": messages, "add_generation_prompt": True}
    if tools:
        body["tools"] = tools
    reply = await raw.post("/tokenize", json=body)
    if reply.status_code != 200:
        raise RuntimeError(f"/tokenize answered {reply.status_code}: {reply.text[:300]}")
    return [int(t) for t in reply.json()["tokens"]]


def first_difference(a: list[int], b: list[int]) -> int | None:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


# What ``force_tools`` sends, turn after turn: each way Chat Completions forces a call.
FORCED_CHOICES: tuple[Any, ...] = (
    "required",
    {"type": "function", "function": {"name": "bash"}},
)


async def drive(
    gateway: httpx.AsyncClient,
    key: str,
    task: str,
    turns: int,
    max_tokens: int,
    force_tools: bool = False,
) -> int:
    """One harness-like session: tool calls answered, arguments re-serialized compactly (as
    harnesses keep them), a follow-up user turn after each text answer. With ``force_tools``
    every call carries a forcing ``tool_choice`` (:data:`FORCED_CHOICES` in turn). Returns how
    many calls were forced."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task},
    ]
    forced = 0
    for turn in range(turns):
        body: dict[str, Any] = {
            "model": "any",
            "messages": messages,
            "tools": [BASH_TOOL],
            "max_tokens": max_tokens,
        }
        if force_tools:
            body["tool_choice"] = FORCED_CHOICES[turn % len(FORCED_CHOICES)]
            forced += 1
        reply = await gateway.post(f"/s/{key}/v1/chat/completions", json=body)
        if reply.status_code != 200:
            raise RuntimeError(f"the gateway answered {reply.status_code}: {reply.text[:300]}")
        message = reply.json()["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        messages.append(
            {
                "role": "assistant",
                "content": message.get("content") or "",
                **({"tool_calls": [_compact(c) for c in calls]} if calls else {}),
            }
        )
        for call in calls:
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": f"ok (turn {turn})"}
            )
        if not calls:
            messages.append({"role": "user", "content": "Good. Now do one more step."})
    return forced


def _compact(call: dict[str, Any]) -> dict[str, Any]:
    arguments = call["function"].get("arguments") or "{}"
    with contextlib.suppress(json.JSONDecodeError):  # malformed text goes back as it came
        arguments = json.dumps(json.loads(arguments), separators=(",", ":"))
    return {**call, "function": {**call["function"], "arguments": arguments}}


async def score_session(
    row: SessionRow,
    records: list[CaptureRecord],
    answered: list[Exchange],
    raw: httpx.AsyncClient,
    model: str,
) -> None:
    """Fill ``row`` from the session's captures, checked against the engine's own reports."""
    row.calls = len(records)
    if len(answered) != len(records):
        row.error = row.error or f"{len(answered)} engine answers for {len(records)} captures"
        return
    truth = {}
    for record, exchange in zip(records, answered, strict=True):
        prompt, sampled, logprobs = engine_tokens(exchange)
        truth[record.completion_id] = prompt
        row.tool_calls += bool(record.response.get("tool_calls"))
        sent = exchange.body.get("prompt")
        row.exact_captures += record.sampled_ids == sampled and _capture_exact(
            record, prompt, logprobs, sent
        )
        if any(flag.startswith(FLAG_RENDERED_WHOLE) for flag in record.flags):
            row.whole_prompts += 1
            upstream = record.upstream_request
            try:
                theirs = await engine_rendering(
                    raw, model, upstream["messages"], upstream.get("tools")
                )
            except (httpx.HTTPError, RuntimeError) as exc:
                row.error = row.error or str(exc)
                continue
            row.whole_exact += theirs == record.prompt_ids
    trajectory = PrefixMergingBuilder().build(records)
    row.traces = len(trajectory.traces)
    by_id = {r.completion_id: r for r in records}
    for trace in trajectory.traces:
        context: list[int] = list(trace.prompt_ids)
        position = 0
        for index, completion_id in enumerate(trace.stats.completion_ids):
            record = by_id[completion_id]
            new = max(len(record.prompt_ids) - len(context), 0)
            claimed = context + trace.response_ids[position : position + new]
            if index:
                row.merged_calls += 1
                row.exact_contexts += claimed == truth[completion_id]
            position += new + len(record.sampled_ids)
            context = claimed + list(record.sampled_ids)


def _capture_exact(
    record: CaptureRecord, prompt: list[int], logprobs: list[float] | None, sent: Any
) -> bool:
    """The record holds what the engine conditioned on (and was sent), and its logprobs."""
    if record.prompt_ids != prompt or (isinstance(sent, list) and sent != prompt):
        return False
    return logprobs is None or record.logprobs == logprobs


def format_report(check: EngineCheck) -> str:
    """The probe's findings as plain-text tables."""
    lines = [
        f"engine   {check.url}",
        f"model    {check.model or '(unknown)'}",
        f"family   {check.family or '(none detected)'}",
        f"render   {check.render_mode}",
    ]
    if parser := check.engine_reasoning_parser:  # forced grammars start after the reasoning
        lines.append(f"engine reasoning parser {parser} (a forced call's grammar starts after it)")
    lines += [f"note     {note}" for note in check.notes]
    if check.render_mode != "gateway":
        lines.append("FAIL     the gateway cannot render for this model: pass --tokenizer")
    lines += ["", f"{'parity (whole prompt vs engine /tokenize)':<44}{'gateway':>8}{'engine':>8}"]
    for row in check.parity:
        state = "ok  " if row.ok else "FAIL"
        detail = row.error or (
            f"first difference at token {row.first_difference}"
            if row.first_difference is not None
            else ""
        )
        lines.append(
            f"{state} {row.case:<39}{row.gateway_tokens:>8}{row.engine_tokens:>8}  {detail}"
        )
    header = ["calls", "forced", "tools", "capt=", "whole", "whole=", "merged", "ctx=", "traces"]
    lines += ["", f"{'tool sessions':<44}" + "".join(f"{h:>7}" for h in header)]
    for srow in check.sessions:
        state = "ok  " if srow.ok else "FAIL"
        values = [
            srow.calls,
            srow.forced_calls,
            srow.tool_calls,
            srow.exact_captures,
            srow.whole_prompts,
            srow.whole_exact,
            srow.merged_calls,
            srow.exact_contexts,
            srow.traces,
        ]
        lines.append(f"{state} {srow.task[:39]:<39}" + "".join(f"{v:>7}" for v in values))
        if srow.error:
            lines.append(f"     error: {srow.error}")
    lines += [
        "",
        "forced= calls sent with a forcing tool_choice; capt= captures equal to the engine's "
        "report; whole= whole prompts equal to the engine's /tokenize; ctx= merged calls whose "
        "trace context is what the engine saw",
    ]
    lines += [f"not run  {gap}" for gap in check.unexercised]
    if check.ok:
        lines.append("result   OK: every prompt, capture and merged context exact")
    elif check.unexercised and _exact_so_far(check):
        forced = check.unforceable is not None or any(r.forced_calls for r in check.sessions)
        hint = "" if forced else "; try --force-tools"
        lines.append(f"result   INCOMPLETE: exact where exercised, but not everything was{hint}")
    else:
        lines.append("result   MISMATCH")
    return "\n".join(lines)


def _exact_so_far(check: EngineCheck) -> bool:
    return (
        check.render_mode == "gateway"
        and all(row.ok for row in check.parity)
        and all(row.ok for row in check.sessions)
    )
