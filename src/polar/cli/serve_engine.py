"""``polar serve-engine``: serve the embedded CPU engine over an OpenAI-compatible port."""

from __future__ import annotations

import argparse
from typing import Any

from polar.engines.embedded.options import DEFAULT_MODEL, DTYPE_NAMES, LOGPROBS_MODES
from polar.extras import require


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve-engine",
        help="serve the embedded CPU engine (vLLM-shaped token fields)",
        description=(
            "Serve a small model on CPU at /v1/chat/completions, /v1/models, /tokenize, "
            "/detokenize and /health, returning prompt ids, sampled ids and logprobs as vLLM does."
        ),
    )
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"{DEFAULT_MODEL!r} (default), 'tiny', a Hugging Face checkpoint dir, or a .gguf file",
    )
    p.add_argument("--served-model-name", action="append", default=[], help="extra model alias")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8200, help="port (default 8200)")
    p.add_argument("--dtype", choices=list(DTYPE_NAMES), default="float32", help="weights dtype")
    p.add_argument("--max-queue", type=int, default=64, help="waiting requests before 429")
    p.add_argument("--max-active", type=int, default=8, help="generations decoded together")
    p.add_argument(
        "--logprobs-mode",
        choices=list(LOGPROBS_MODES),
        default="raw",
        help="raw: before temperature/top-k/top-p (as vLLM); processed: the sampled distribution",
    )
    p.add_argument("--kv-cache-entries", type=int, default=32, help="prefix cache entries (0: off)")
    p.add_argument("--kv-cache-mb", type=int, default=2048, help="prefix cache memory bound")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require("embedded", "polar serve-engine")
    import torch

    from polar.engines.embedded import EmbeddedEngineCore, create_app
    from polar.serving import ServerLimits, serve

    if args.threads:
        torch.set_num_threads(args.threads)
    core = EmbeddedEngineCore.from_source(
        args.model,
        dtype=args.dtype,
        max_queue=args.max_queue,
        max_active=args.max_active,
        logprobs_mode=args.logprobs_mode,
        kv_cache_entries=args.kv_cache_entries,
        kv_cache_bytes=args.kv_cache_mb << 20,
    )
    app = create_app(core, served_model_names=args.served_model_name)
    print(
        f"Polar embedded engine: {core.model_name} on http://{args.host}:{args.port}/v1 "
        f"(logprobs: {args.logprobs_mode}, context: {core.max_model_len})"
    )
    try:
        serve(app, host=args.host, port=args.port, limits=ServerLimits())
    finally:
        core.close()
    return 0
