"""Gateway configuration: strict pydantic models, so a typo in a key is an error, not a no-op."""

from __future__ import annotations

import logging
import resource
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from polar.config_loader import load_config
from polar.engines.registry import EngineConfig
from polar.schemas.ids import NodeId
from polar.schemas.sampling import SamplingPolicy  # users still import it from here
from polar.serving import ServerLimits
from polar.tokens import GATEWAY_TOKEN_FILE

log = logging.getLogger("polar.gateway")


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

    def sandboxes_at_once(self) -> int:
        """The most runtimes the node holds at once: ``ready_buffer`` being prepared or
        waiting, one per run worker, one per POSTRUN worker (evaluate, then teardown)."""
        return self.ready_buffer + self.run_workers + self.postrun_workers


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
    engine_reasoning_parser: str | None = Field(
        None,
        description="The reasoning parser the engine runs (vLLM --reasoning-parser NAME), if "
        "any: vLLM then applies a forced tool_choice's grammar only after the model ends its "
        "reasoning (</think>), unless the prompt already ended it. The gateway sends the call "
        "pattern that starts there and flags the record "
        "tool_choice_enforced:<field>:after_reasoning; a model that never closes its reasoning "
        "is not constrained.",
    )
    eot_token: list[str] | None = Field(
        None,
        description="Override the family's end-of-turn tokens: one token or a list of them "
        "(Llama 3: [<|eot_id|>, <|eom_id|>]); the first is the one a turn usually ends with.",
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

    @field_validator("eot_token", mode="before")
    @classmethod
    def _one_or_several(cls, value: object) -> object:
        """A single token is a list of one; an empty list or token would end no turn."""
        tokens = [value] if isinstance(value, str) else value
        if isinstance(tokens, list) and (not tokens or "" in tokens):
            raise ValueError("eot_token needs at least one non-empty token")
        return tokens


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

    def server_limits(self) -> ServerLimits:
        """``limits`` as the gateway's server applies them: a node's reserve also holds what
        its sandboxes' gateway relays may open (their connections bypass the server's cap).

        Where the descriptor limit cannot hold every relay at its cap beside the server's own
        connections, the relays get half of what ``reserved_fds`` leaves and a warning names
        the limit that would hold both: the whole reserve would leave the server one
        connection, refusing every harness and the rollout server (1,000 run slots ask
        67,000 descriptors for relays; bench/rollout_scale.py)."""
        if self.node is None:
            return self.limits
        from polar.runtimes.gateway_relay import relay_descriptors

        relays = relay_descriptors(self.node.sandboxes_at_once())
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        budget = soft if hard == resource.RLIM_INFINITY else hard  # as raise_descriptor_limit
        share = max(0, budget - self.limits.reserved_fds) // 2
        if budget != resource.RLIM_INFINITY and relays > share:
            needed = self.limits.reserved_fds + relays + 2 * self.limits.max_connections
            log.warning(
                "descriptor limit %d cannot hold the relays of %d sandboxes at their cap (%d) "
                "beside %d connections; relays get %d: raise the hard limit (ulimit -Hn, "
                "LimitNOFILE) to %d, or lower the node's workers",
                budget, self.node.sandboxes_at_once(), relays,
                self.limits.max_connections, share, needed,
            )  # fmt: skip
            relays = share
        reserve = self.limits.reserved_fds + relays
        return self.limits.model_copy(update={"reserved_fds": reserve})

    def token_file(self) -> Path:
        """Where the gateway keeps the admin token it made (when none is configured)."""
        return self.capture_db.parent / GATEWAY_TOKEN_FILE

    @classmethod
    def from_yaml(cls, path: str | Path) -> GatewayConfig:
        return load_config(cls, path, what="gateway config")
