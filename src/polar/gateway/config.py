"""Gateway configuration: strict pydantic models, so a typo in a key is an error, not a no-op."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from polar.config_loader import load_config
from polar.engines.registry import EngineConfig
from polar.schemas.ids import NodeId
from polar.schemas.sampling import SamplingPolicy  # users still import it from here
from polar.serving import ServerLimits
from polar.tokens import GATEWAY_TOKEN_FILE


class NodeConfig(BaseModel):
    """Session lifecycle of a gateway node: worker counts per stage and its rollout server."""

    model_config = ConfigDict(extra="forbid")

    node_id: NodeId = "node-0"
    init_workers: int = Field(2, ge=1, description="Sessions starting a runtime at once.")
    run_workers: int = Field(4, ge=1, description="Harnesses running at once (run slots).")
    postrun_workers: int = Field(2, ge=1, description="Build/evaluate/teardown at once.")
    evaluator_threads: int = Field(
        8,
        ge=1,
        description="Threads for POST-RUN's blocking work (evaluators' reads and waits), apart "
        "from the loop's: a wedged evaluator costs one of these, never a call's thread.",
    )
    ready_buffer: int = Field(
        4,
        ge=0,
        description="Runtimes prepared ahead of a run slot (in INIT or READY); 0: INIT inline.",
    )
    queue_limit: int = Field(256, ge=1, description="Unfinished sessions accepted before 429.")
    work_dir: Path = Field(Path("polar-sessions"), description="Per-session directories.")
    rollout_url: str | None = Field(None, description="Register, heartbeat and report here.")
    rollout_token: str | None = Field(
        None,
        description="The enrolment secret this node registers with: the rollout server's "
        "enrolment_secret or its admin token. Once registered, the node uses its own credential.",
    )
    rollout_token_file: Path | None = Field(
        None,
        description="Read the enrolment secret from this file when rollout_token is not set "
        "(a rollout server on this machine keeps its admin token in <data_dir>/rollout.token).",
    )
    heartbeat_s: float = Field(2.0, gt=0)
    report_backoff_max_s: float = Field(10.0, gt=0, description="Result delivery backoff cap.")
    keep_finished: int = Field(4096, ge=0, description="Finished sessions kept for GET.")


class RenderConfig(BaseModel):
    """Who renders prompts: the gateway (token prompts, exact merged contexts) or the engine."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["auto", "gateway", "engine"] = Field(
        "auto",
        description="gateway: the gateway renders with the served model's tokenizer and chat "
        "template, splices sampled ids for this session's earlier turns and sends token ids; "
        "engine: the engine renders chat messages (contexts may drift from what was sampled); "
        "auto: gateway whenever a tokenizer is known (in-process engines, `tokenizer`, or a "
        "model directory the engine reports), else engine with a warning.",
    )
    tokenizer: str | None = Field(
        None,
        description="The served model's tokenizer: HF directory, .gguf file or hub id "
        "(default: the in-process engine's, else the engine's model directory).",
    )
    chat_template: str | None = Field(
        None,
        description="A .jinja file or a template Polar ships (smollm2_tools) replacing the "
        "tokenizer's own.",
    )
    family: str | None = Field(
        None,
        description="The served model's family (smollm2, qwen2_5, qwen3, qwen3_next, qwen3_5, "
        "qwen3_coder, llama3, glm47, ..., tokenizer, or module:Class): its template, parser, "
        "turn ends and reasoning policy. Default: detected from the tokenizer.",
    )
    tool_parser: str | None = Field(
        None,
        description="Override the family's parser of sampled text into tool calls and "
        "reasoning: hermes, qwen3, qwen3_coder, llama3_json, glm47, ..., or module:Class. With "
        "no family known, naming one serves the model with its tokenizer's own template.",
    )
    eot_token: str | None = Field(
        None, description="Override the family's end-of-turn tokens with this one token."
    )
    reasoning_history: Literal["keep", "drop"] | None = Field(
        None,
        description="For reasoning families, after a new user message: keep splices the past "
        "turns' reasoning as sampled (one merged trace; differs from what the template "
        "renders), drop renders the prompt whole as the template does (the trace splits "
        "there). Default: the family's (drop where its template drops past reasoning).",
    )
    turns_kept: int = Field(
        16, ge=1, description="Sampled turns remembered per session for splicing."
    )
    default_max_tokens: int = Field(
        4096,
        ge=1,
        description="Output budget sent with a token prompt when neither the request, "
        "sampling.max_tokens nor a context window sets one (vLLM's /v1/completions stops at "
        "16 tokens without one); flagged max_tokens_defaulted on the record.",
    )


class GatewayConfig(BaseModel):
    """Everything a gateway node needs to proxy and capture."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8100, ge=0, le=65535)
    public_url: str | None = Field(
        None, description="URL harnesses use to reach this gateway (default http://host:port)."
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)
    served_model: str | None = Field(
        None, description="Model name sent upstream on every call, whatever the harness asked."
    )
    sampling: SamplingPolicy = Field(default_factory=SamplingPolicy)
    context_window: int | None = Field(
        None,
        gt=0,
        description="The model's context window; default: what the engine reports "
        "(vLLM's max_model_len). Output budgets are clamped so prompt + output fit, and a "
        "prompt that does not fit gets the provider's context-length error.",
    )
    render: RenderConfig = Field(default_factory=RenderConfig)
    capture_db: Path = Field(Path("polar-captures.db"), description="SQLite capture store path.")
    store_raw_requests: bool = Field(True, description="Keep each provider-native request body.")
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)
    auto_register: bool = Field(False, description="Accept unknown keys as new sessions.")
    admin_token: str | None = Field(
        None,
        description="The token /polar/* (admin and node API), /docs and /openapi.json need; "
        "default: made at first start and kept 0600 in gateway.token beside capture_db.",
    )
    auth: bool = Field(
        True,
        description="false: no admin token at all, for experiments on a loopback host only "
        "(refused on any other host).",
    )
    limits: ServerLimits = Field(
        default_factory=ServerLimits,
        description="Connections, header/body read time, keep-alive (see docs/configuration.md).",
    )
    stream_status_grace_s: float = Field(
        0.5,
        ge=0,
        description="How long a streamed call's headers wait for the engine: an error in that "
        "time (an engine's 429 or 400 comes back in milliseconds) is answered with its HTTP "
        "status, so SDKs retry as against the provider; later ones are in-stream errors.",
    )
    stream_keepalive_s: float = Field(
        10.0,
        gt=0,
        description="After the status grace the headers leave; while the engine works, the "
        "provider's keep-alive (Anthropic ping events, an SSE comment for OpenAI, an empty "
        "chunk for Gemini) follows every this many seconds.",
    )
    policy_version: int = 0
    node: NodeConfig | None = Field(
        None, description="Run the session lifecycle (a rollout node) beside the proxy."
    )
    capture_synchronous: Literal["NORMAL", "FULL"] = Field(
        "NORMAL",
        description="Capture durability: NORMAL survives a process crash at every acknowledged "
        "call; FULL also survives power loss (an fsync per group commit).",
    )

    def base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    def token_file(self) -> Path:
        """Where the gateway keeps the admin token it made (when none is configured)."""
        return self.capture_db.parent / GATEWAY_TOKEN_FILE

    @classmethod
    def from_yaml(cls, path: str | Path) -> GatewayConfig:
        return load_config(cls, path, what="gateway config")
