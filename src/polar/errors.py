"""Polar's exception hierarchy, in one place (as httpx does).

Every error a caller can see carries an HTTP status and a short machine-readable ``kind``; each
provider adapter renders these into its own wire shape, so the gateway never invents error
formats per route. Errors that also are a builtin kind (a refused file is an ``OSError``, a spent
call budget a ``TimeoutError``) inherit both, so ``except OSError`` keeps catching them.
Errors only the code catches (a broken tool-call markup, a turn that cannot be split) keep
status 500: if one ever escaped to a caller, it would be a bug.
"""

from __future__ import annotations

from enum import StrEnum


class PolarError(Exception):
    """Base class of every error Polar raises on purpose."""

    status: int = 500
    """The HTTP status a server answers this error with."""


class GatewayError(PolarError):
    """An error the gateway answers with, rendered in the caller's provider shape."""

    status: int = 500
    kind: str = "internal_error"

    def __init__(
        self, message: str, *, status: int | None = None, retry_after: float | None = None
    ):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.retry_after = retry_after


class InvalidRequest(GatewayError):
    """The request body or parameters are malformed (HTTP 400)."""

    status = 400
    kind = "invalid_request"


class CallBudgetSpent(InvalidRequest):
    """The session has made the model calls its task allows (``agent.max_model_calls``): a
    400, not a 429, so the harness stops instead of retrying (HTTP 400)."""

    kind = "call_budget_spent"


class ContextLengthExceeded(InvalidRequest):
    """The prompt does not fit the model's context window (HTTP 400). Each provider words it
    its own way, since harnesses key their compaction on that wording."""

    kind = "context_length_exceeded"

    def __init__(self, prompt_tokens: int, limit: int) -> None:
        super().__init__(f"prompt is too long: {prompt_tokens} tokens > {limit} maximum")
        self.prompt_tokens = prompt_tokens
        self.limit = limit


class AuthenticationFailed(GatewayError):
    """No session matches the key or URL prefix (HTTP 401)."""

    status = 401
    kind = "authentication"


class NotFound(GatewayError):
    """Unknown path or resource (HTTP 404)."""

    status = 404
    kind = "not_found"


class PayloadTooLarge(GatewayError):
    """The request body exceeds the configured limit (HTTP 413)."""

    status = 413
    kind = "request_too_large"


class RateLimited(GatewayError):
    """Too many queued requests; retry later (HTTP 429)."""

    status = 429
    kind = "rate_limit"


class ClientDisconnected(GatewayError):
    """The caller hung up before its completion was ready; the engine call was cancelled
    (HTTP 499, which nobody receives: it only names the outcome in logs)."""

    status = 499
    kind = "client_disconnected"


class EngineError(GatewayError):
    """The inference engine answered with an error or an unusable reply (HTTP 502)."""

    status = 502
    kind = "engine_error"


class MalformedEngineReply(EngineError):
    """The engine's reply has a field that cannot be read exactly, e.g. a token id that is not
    an integer (HTTP 502); ``flag`` names the fault as record flags do."""

    flag = "engine_reply_malformed"


class EngineRejected(EngineError):
    """The engine refused the request as invalid (HTTP 400 passed on to the caller)."""

    status = 400
    kind = "invalid_request"


class EngineUnavailable(EngineError):
    """The engine is unreachable, paused past its timeout, or overloaded (HTTP 503)."""

    status = 503
    kind = "overloaded"


class EngineTimeout(EngineError):
    """The engine did not answer in time (HTTP 504)."""

    status = 504
    kind = "timeout"


class CaptureError(GatewayError):
    """A completion could not be stored exactly, so it was not acknowledged (HTTP 500).

    Only the call whose record failed gets this; the records beside it in the same group
    commit are stored and acknowledged as usual.
    """

    status = 500
    kind = "capture_error"


class CaptureUnavailable(CaptureError):
    """The capture store cannot commit now (its write lock is held past the busy timeout, an
    I/O error); new calls are refused until a write succeeds again, reads keep working (503)."""

    status = 503
    kind = "capture_unavailable"


class InsufficientStorage(CaptureUnavailable):
    """The capture store's disk, or its configured size limit, is full (HTTP 507)."""

    status = 507
    kind = "insufficient_storage"


class CorruptRecord(PolarError):
    """A stored record cannot be decoded exactly; ``completion_id`` names the row."""

    def __init__(self, completion_id: str, reason: str):
        super().__init__(f"record {completion_id}: {reason}")
        self.completion_id = completion_id
        self.reason = reason


class ConfigError(PolarError):
    """A configuration file or option is invalid; the message says which key and why."""


class RuntimeStartError(PolarError):
    """A runtime could not be started: a missing tool, a failed container start, a prepare step.

    ``stderr_tail`` holds the end of the failing command's error output, the part a user needs.
    """

    def __init__(
        self,
        message: str,
        *,
        command: str | None = None,
        exit_code: int | None = None,
        stderr_tail: str = "",
    ):
        detail = f"{message}\n{stderr_tail}" if stderr_tail else message
        super().__init__(detail)
        self.message = message
        self.command = command
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail


class HarnessError(PolarError):
    """A harness could not run or failed: missing CLI, bad settings, non-zero exit.

    ``stderr_tail`` holds the end of the CLI's error output, so a session result says why.
    """

    def __init__(
        self,
        message: str,
        *,
        harness: str | None = None,
        exit_code: int | None = None,
        stdout_tail: str = "",
        stderr_tail: str = "",
    ):
        detail = f"{message}\n{stderr_tail}" if stderr_tail else message
        super().__init__(detail)
        self.message = message
        self.harness = harness
        self.exit_code = exit_code
        self.stdout_tail = stdout_tail
        self.stderr_tail = stderr_tail


class HarnessTimeout(HarnessError):
    """The harness ran past its time budget and was killed (what it captured still counts)."""


# -- the gateway node: sessions, the sandbox's view, the engine stand-in -------------------------


class ModelApiRefused(PolarError):
    """The sandbox's model-API view answers a request itself (another session's key: 403; not
    the model API: 404); ``status`` and ``kind`` shape the reply."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


class ModelCallsSpent(PolarError, TimeoutError):
    """The session used every model call its task allows; the harness was stopped.
    ``failure`` is the SessionFailure the session ends with."""

    status = 429

    def __init__(self, message: str, *, failure: object = None) -> None:
        super().__init__(message)
        self.failure = failure


class NodeFull(PolarError):
    """The node holds ``queue_limit`` unfinished sessions."""

    status = 429


class NodeDraining(PolarError):
    """The node is draining and accepts no new sessions."""

    status = 503


class AlreadyRan(PolarError):
    """The session id was used on this node before (a previous run of the node): never rerun."""

    status = 409


class EngineRefusal(PolarError):
    """An HTTP error the scripted engine answers with, in vLLM's words."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class MalformedCall(PolarError, ValueError):
    """Raised inside a tool-call parser when a call's markup is broken; the turn becomes plain
    content (never reaches a caller)."""


class SplitError(PolarError):
    """A re-rendered turn cannot be split; ``reason`` is a break reason for the trajectory
    (never reaches a caller)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- what the host reads from a sandbox -----------------------------------------------------------


class UnsafeFile(PolarError, OSError):
    """A path the host does not read or write: not a regular file (a link, FIFO, device,
    socket or directory), or larger than allowed."""


class TreeTooLarge(PolarError, OSError):
    """A sandbox's tree with more entries or deeper directories than a walk visits."""


# -- the rollout server and its client -----------------------------------------------------------


class TaskRefused(PolarError, ValueError):
    """A task this server will not run (its nodes' provider refuses it, or its callback)."""

    status = 422


class CallbackRefused(TaskRefused):
    """A task's callback_url names a host the server may not call."""


class TaskConflict(PolarError):
    """A task with this id exists and was submitted with a different request: a task id is
    never silently replaced, so a retried submit can never overwrite results."""

    status = 409

    def __init__(self, task_id: str, task_status: StrEnum) -> None:
        super().__init__(
            f"task {task_id!r} already exists ({task_status.value}) with a different request; "
            "submit it under a new task id"
        )
        self.task_id = task_id
        self.task_status = task_status


class RolloutTimeout(PolarError, TimeoutError):
    """The rollout server did not finish the tasks in time."""

    status = 504
