"""The ``presto serve`` command: its options and its blocking run, called from the CLI."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any

from presto_client.errors import ConfigError
from presto_client.terminal_text import server_text


def add_serve_parser(
    subs: Any,
    config_options: Callable[[argparse.ArgumentParser], None],
    common: Callable[[argparse.ArgumentParser], None],
) -> argparse.ArgumentParser:
    serve = subs.add_parser(
        "serve",
        help="serve power sampling as an OpenAI-compatible API (completions, chat)",
        description="Serve the config's first engine and sampler behind POST /v1/completions "
        "and /v1/chat/completions (plain and stream), GET /v1/models, /health, /metrics. "
        "See docs/serve.md.",
    )
    config_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8100, help="port (default 8100; 0: any)")
    serve.add_argument(
        "--traversal", default="stream", help="traversal of a request without one (stream)"
    )
    serve.add_argument("--model-name", help="the model id clients name (default: engine name)")
    serve.add_argument("--api-key-env", metavar="NAME", help="require Authorization: Bearer $NAME")
    serve.add_argument("--max-active", type=int, default=64, help="requests run at once (64)")
    serve.add_argument(
        "--max-queue", type=int, default=256, help="requests that may wait; then 429 (256)"
    )
    serve.add_argument(
        "--request-timeout", type=float, default=600.0, help="per-request deadline, s (600)"
    )
    serve.add_argument(
        "--max-body-bytes", type=int, default=1 << 20, help="largest request body (1 MiB)"
    )
    serve.add_argument(
        "--max-n",
        type=int,
        help="largest n per request (default: serve.limits.max_n of the config, 16)",
    )
    serve.add_argument(
        "--max-tokens",
        type=int,
        help="largest max_tokens per request (default: serve.limits.max_tokens, 4096); "
        "every other bound: --set serve.limits.NAME=VALUE (docs/serve.md)",
    )
    serve.add_argument(
        "--shutdown-grace",
        type=float,
        default=20.0,
        metavar="S",
        help="on SIGTERM/SIGINT, how long running requests may finish before they are cut "
        "(20); queued ones are answered 503 at once, a second signal stops at once",
    )
    serve.add_argument(
        "--idle-timeout",
        type=float,
        default=15.0,
        metavar="S",
        help="a connection's deadline for a request's headers, and for idling (15)",
    )
    serve.add_argument(
        "--body-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="a request's deadline for its body; 408 past it (30)",
    )
    serve.add_argument(
        "--max-connections",
        type=int,
        metavar="N",
        help="open connections; one more is answered 503 and closed (default: half of the "
        "descriptor limit, at most 1024)",
    )
    serve.add_argument("--no-probe", action="store_true", help="skip the engine's start-up probe")
    common(serve)
    return serve


def options_from(args: argparse.Namespace, cfg: Any = None) -> Any:
    """The service's options: the command line's, its limits those of the config's
    ``serve.limits`` with ``--max-n`` / ``--max-tokens`` over them."""
    from presto_client.orchestration.config.serve_config import ServeLimits
    from presto_client.serve.app import ServeOptions

    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise ConfigError(
                f"--api-key-env {args.api_key_env}: the variable is not set; export "
                f"{args.api_key_env}=... before serving"
            )
    if args.model_name is not None and (
        not args.model_name or server_text(args.model_name) != args.model_name
    ):
        raise ConfigError(
            f"--model-name {server_text(args.model_name)}: a model id is printable text of at "
            "most 200 characters, without control characters (ESC, CR, LF, ...) or "
            "bidirectional overrides"
        )
    base = cfg.serve.limits if cfg is not None else ServeLimits()
    given = {
        k: v for k, v in (("max_n", args.max_n), ("max_tokens", args.max_tokens)) if v is not None
    }
    try:
        limits = ServeLimits.model_validate({**base.model_dump(), **given})
    except ValueError as exc:
        raise ConfigError(f"--max-n / --max-tokens: {exc}") from None
    return ServeOptions(
        host=args.host,
        port=args.port,
        traversal=args.traversal,
        model_name=args.model_name,
        api_key=key,
        max_active=args.max_active,
        max_queue=args.max_queue,
        request_timeout_s=args.request_timeout,
        max_body_bytes=args.max_body_bytes,
        limits=limits,
        probe=not args.no_probe,
        shutdown_grace_s=getattr(args, "shutdown_grace", 20.0),
        idle_timeout_s=getattr(args, "idle_timeout", 15.0),
        body_timeout_s=getattr(args, "body_timeout", 30.0),
        max_connections=getattr(args, "max_connections", None),
    )


def run_serve(args: argparse.Namespace, cfg: Any) -> int:
    """Serve until interrupted; 0 on a clean stop, 1 when running requests were cut."""
    from presto_client.core.sampler_config import arm_traversal_names
    from presto_client.orchestration.engines.opening import start_embedded_servers
    from presto_client.orchestration.job import event_loop_factory
    from presto_client.orchestration.planning.plan import make_plan
    from presto_client.serve.lifecycle import serve_until_stopped

    if cfg.executor.kind != "local":
        raise ConfigError(
            f"executor.kind {cfg.executor.kind}: presto serve runs every chain in its own "
            "process; the Ray executor is for presto run and compare (set executor.kind=local, "
            "or run several presto serve behind a load balancer)"
        )
    if args.traversal not in arm_traversal_names():
        raise ConfigError(
            f"--traversal {args.traversal}: valid traversals are {', '.join(arm_traversal_names())}"
        )
    options = options_from(args, cfg)
    with contextlib.ExitStack() as stack:
        servers: dict[str, Any] = {}
        urls = start_embedded_servers(
            make_plan(cfg, ()), stack, only=[str(cfg.engines[0].name)], started=servers
        )
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            return runner.run(serve_until_stopped(cfg, options, urls, servers))
