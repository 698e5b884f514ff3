"""``polar serve-gateway``: run a gateway node (standalone capture mode)."""

from __future__ import annotations

import argparse
from typing import Any

from polar.cli.arguments import add_family_arguments
from polar.engines.registry import EngineConfig
from polar.errors import ConfigError
from polar.gateway.app import create_app
from polar.gateway.config import GatewayConfig
from polar.gateway.listen import bind_gateway
from polar.serving import serve
from polar.stack.topology import Topology


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve-gateway",
        help="run the provider gateway and capture every model call",
        description="Point any harness at this gateway; every call is captured token-faithfully.",
    )
    p.add_argument("--config", help="gateway YAML (see docs/configuration.md)")
    p.add_argument("--topology", help="topology YAML (see docs/rollout.md); needs --node")
    p.add_argument("--node", help="this node's id in the topology")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8100)")
    p.add_argument("--engine", help="engine kind: vllm, sglang, scripted, or module:Class")
    p.add_argument("--engine-url", help="engine server URL (vllm/sglang)")
    p.add_argument(
        "--served-model", help="model name sent upstream (default: what the engine serves)"
    )
    p.add_argument(
        "--context-window",
        type=int,
        help="the model's context window (default: the engine's max_model_len)",
    )
    p.add_argument(
        "--max-tokens", type=int, help="cap on output tokens per call (larger asks are clamped)"
    )
    p.add_argument(
        "--render",
        choices=["auto", "gateway", "engine"],
        help="who renders prompts (default auto: the gateway when it knows the tokenizer)",
    )
    p.add_argument("--tokenizer", help="served model's tokenizer: HF dir, .gguf or hub id")
    p.add_argument("--chat-template", help="a .jinja chat template replacing the tokenizer's")
    add_family_arguments(p)
    p.add_argument("--capture-db", help="SQLite capture store path")
    p.add_argument("--auto-register", action="store_true", help="accept unknown keys as sessions")
    p.add_argument(
        "--admin-token",
        help="token /polar/* routes need (default: made at first start in gateway.token beside "
        "the capture db)",
    )
    p.add_argument(
        "--no-auth",
        action="store_true",
        help="no admin token at all (loopback only, for experiments)",
    )
    # A server's log is where its sessions' lifecycle events go (docs/observability.md#logs).
    p.set_defaults(func=run, default_log_level="info")


def load_config(args: argparse.Namespace) -> GatewayConfig:
    if args.topology or args.node:
        if not (args.topology and args.node):
            raise ConfigError("--topology and --node go together")
        if args.config:
            raise ConfigError("give either --config or --topology/--node, not both")
        config = Topology.from_yaml(args.topology).gateway_config(args.node)
    else:
        config = GatewayConfig.from_yaml(args.config) if args.config else GatewayConfig()
    updates: dict[str, Any] = {}
    for name in ("host", "port", "served_model", "capture_db", "admin_token", "context_window"):
        value = getattr(args, name)
        if value is not None:
            updates[name] = value
    if args.auto_register:
        updates["auto_register"] = True
    if args.no_auth:
        updates["auth"] = False
    if args.max_tokens is not None:
        updates["sampling"] = config.sampling.model_copy(update={"max_tokens": args.max_tokens})
    render = {
        key: getattr(args, attr)
        for key, attr in (
            ("mode", "render"),
            ("tokenizer", "tokenizer"),
            ("chat_template", "chat_template"),
            ("family", "family"),
            ("tool_parser", "tool_parser"),
        )
        if getattr(args, attr) is not None
    }
    if render:
        updates["render"] = config.render.model_copy(update=render)
    engine_set = "kind" in config.engine.model_fields_set
    if args.engine or args.engine_url:
        engine = config.engine.model_dump()
        if args.engine:
            engine["kind"] = args.engine
        elif not engine_set:
            # An engine URL alone is an OpenAI-compatible server, never the scripted stand-in.
            engine["kind"] = "vllm"
        if args.engine_url:
            engine["base_url"] = args.engine_url
        updates["engine"] = EngineConfig.model_validate(engine)
    elif not engine_set:
        raise ConfigError(
            "no engine given: use --engine-url URL (a vLLM or SGLang server; --engine sglang for "
            "SGLang), --engine embedded (SmolLM2 on CPU), or --engine scripted (canned replies, "
            "for tests and demos)"
        )
    return config.model_validate(config.model_dump() | updates)


def run(args: argparse.Namespace) -> int:
    # Bound before the app is built: with --port 0 or --host 0.0.0.0 the node registers the
    # port it really has and an address others can route to.
    config, sock = bind_gateway(load_config(args))
    app = create_app(config)
    print(
        f"Polar gateway on {config.base_url()} (engine: {config.engine.kind}, render: "
        f"{config.render.mode}); create a session: POST {config.base_url()}/polar/sessions"
    )
    if not config.auth:
        print("auth is OFF: any process on this machine may drive this gateway")
    elif not config.admin_token:
        print(f"admin token (/polar/*, /docs): {config.token_file()}")
    serve(app, host=config.host, port=config.port, limits=config.server_limits(), sock=sock)
    return 0
