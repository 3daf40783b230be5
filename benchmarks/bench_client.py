"""The HTTP client's own CPU cost per request and per streamed token (issue 8).

One command starts the latency-model server (``benchmarks.latency_server``, vLLM dialect, in a
subprocess: its CPU is not the client's), then, for every configuration (client implementation x
concurrency x proposal length x streaming or not), runs a client in a fresh subprocess: ``C``
concurrent chain-shaped workers, each sending proposals one after another (``T`` tokens, top-20
raw logprobs, its own seed, scores at τ = 1 and 0.25) through the project's real client
(``create_engine(...).generate`` / ``.stream``). Per configuration it reports the client's CPU
time (``getrusage`` of the client process: user + system) per HTTP request and per token, wall
time, and the server's peak and mean running requests over the measured window.

Client implementations (``--impls``):

``before``       the library as of ``--before-rev`` (``git archive`` of that commit into a
                 temporary folder put first on ``PYTHONPATH``; e.g. ``--before-rev main``
                 compares a branch with main, interleaved as ``--impls before,after,before,after``).
``after``        the current library as shipped (aiohttp's pool, orjson, per-response arrays).
``after-uvloop`` as ``after`` on uvloop's event loop (when uvloop is installed).
``raw-aiohttp``  a floor, not a client: the same requests (built by the adapter) sent on the
                 engine's pool (aiohttp's), bodies read but neither decoded nor parsed (tokens
                 counted as requested): what HTTP and the event loop alone cost.

    .venv/bin/python -m benchmarks.bench_client --concurrency 10,100,1000 --T 64,512

Prints a markdown table (and writes ``results.json`` / ``results.md`` under ``--out``).
``--cprofile DIR`` saves a cProfile of each client run (``DIR/<config>.prof``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
IMPLS = ("before", "after", "after-uvloop", "raw-aiohttp")
PROMPT_LEN = 32


# ---- the client (runs in its own process) ---------------------------------------------------


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _client(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from presto_client import backends
    from presto_client.backends import EngineSpec, create_engine
    from presto_client.core.engine_protocol import ProposalRequest, ScoreSpec

    spec = EngineSpec("vllm", (args.url,), top_k=20, max_concurrency=args.C, max_retries=0)
    engine = create_engine(spec)
    scores = ScoreSpec((1.0, 0.25))
    rng = random.Random(args.C * 1000 + args.T)
    prompts = [tuple(rng.randrange(64) for _ in range(PROMPT_LEN)) for _ in range(args.C)]
    tokens = 0
    requests = 0

    async def one(worker: int, step: int, n: int) -> None:
        nonlocal tokens, requests
        request = ProposalRequest(prompts[worker], n, 0.25, worker * 100_003 + step + 1, scores)
        if args.impl == "raw-aiohttp":
            await _raw(engine, request, args.stream)
            tokens += n
        elif args.stream:
            async for chunk in engine.stream(request):
                tokens += len(chunk.token_ids)
        else:
            (out,) = await engine.generate([request])
            tokens += len(out.token_ids)
        requests += 1

    async def chain(worker: int, n_requests: int) -> None:
        for step in range(n_requests):
            await one(worker, step, args.T)

    # Warm-up, not measured: the model resolved, the server's caches filled, and every
    # connection opened. Short warm-up proposals finished before the last worker had sent its
    # own, so connections were reused and most of a C = 1,000 pool was opened inside the
    # measured window (976 connects in 1,000 requests): proposals of the measured length
    # overlap, as a long-running job's chains do.
    await one(0, -1, 1)
    await asyncio.gather(*[one(w, -1, args.T) for w in range(args.C)])
    with httpx.Client(base_url=args.url, timeout=30) as admin:
        admin.post("/stats/reset")  # noqa: ASYNC212 (outside the measured window)
        tokens = requests = 0
        profiler = None
        if args.cprofile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        cpu0, wall0 = _cpu_s(), time.perf_counter()
        await asyncio.gather(*[chain(w, args.requests_per_chain) for w in range(args.C)])
        cpu1, wall1 = _cpu_s(), time.perf_counter()
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.cprofile)
        stats = admin.get("/stats").json()  # noqa: ASYNC212 (idem)
    scorer = getattr(engine.generation, "scorer", None)  # (absent before the batched scoring)
    await engine.aclose()
    cpu = cpu1 - cpu0
    wall = wall1 - wall0
    return {
        "impl": args.impl,
        "library": os.path.dirname(backends.__file__),
        "loop": type(asyncio.get_running_loop()).__module__,
        "C": args.C,
        "T": args.T,
        "stream": args.stream,
        "requests": requests,
        "tokens": tokens,
        "client_cpu_s": cpu,
        "client_sys_s": usage1.ru_stime - usage0.ru_stime,  # of which in the kernel
        "wall_s": wall,
        "cpu_per_request_ms": 1e3 * cpu / max(requests, 1),
        "cpu_per_token_us": 1e6 * cpu / max(tokens, 1),
        "client_cpu_share": cpu / wall if wall else 0.0,
        "chunks_per_scoring_pass": scorer.chunks / scorer.batches
        if scorer is not None and scorer.batches
        else None,
        "server_peak_running": stats.get("peak_running"),
        "server_mean_running": stats.get("mean_running"),
        "server_starved_share": stats.get("starved_share"),
        "server_busy_s": stats.get("busy_s"),
    }


async def _raw(engine: Any, request: Any, stream: bool) -> None:
    """``raw-aiohttp``: one request on the engine's pool, the body read and dropped."""
    import orjson

    transport = engine.transport
    call = engine.adapter.build_generate(request, await engine.model(), label="", stream=stream)
    pool, url, headers = transport._pool, transport._url + call.path, transport.headers.json
    body = orjson.dumps(call.payload)
    if stream:
        reply = await pool.open("POST", url, body, headers)
        try:
            async for _ in reply.chunks():
                pass
        finally:
            await reply.aclose()
    else:
        await pool.fetch("POST", url, body, headers, max_bytes=1 << 30)


def _load_backends_from(src: Path) -> None:
    """``presto_client.backends`` from ``src/backends`` (the editable install maps that name to
    this checkout's ``backends/``, whatever comes first on ``PYTHONPATH``)."""
    import importlib.util

    init = src / "backends" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        "presto_client.backends", init, submodule_search_locations=[str(init.parent)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["presto_client.backends"] = module
    spec.loader.exec_module(module)


def client_main(args: argparse.Namespace) -> None:
    if args.before_src:
        _load_backends_from(Path(args.before_src))
    if args.impl == "after-uvloop":
        import uvloop

        result = uvloop.run(_client(args))
    else:
        result = asyncio.run(_client(args))
    print(json.dumps(result), flush=True)


# ---- the driver ------------------------------------------------------------------------------


def _extract(rev: str, dest: Path) -> Path:
    """The library (``backends``, ``presto_client``) as of ``rev``, without touching the repo."""
    archive = dest / "src.tar"
    with archive.open("wb") as fh:
        subprocess.run(
            ["git", "archive", rev, "backends", "presto_client"], cwd=ROOT, stdout=fh, check=True
        )
    with tarfile.open(archive) as tar:
        tar.extractall(dest / "src", filter="data")
    return dest / "src"


def _start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    from benchmarks import latency_server  # (not at import: the child processes skip it)

    options = ["--profile", args.profile, "--time-scale", str(args.time_scale)]
    options += ["--stream-interval", str(args.stream_interval)]
    if args.max_num_seqs:
        options += ["--max-num-seqs", str(args.max_num_seqs)]
    return latency_server.spawn(options, cwd=ROOT)


def _table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| client | chains | T | streaming | requests | client CPU / request | "
        "client CPU / token | client CPU share of wall | server running: peak / mean |\n"
        "|---|---:|---:|---|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['impl']} | {r['C']} | {r['T']} | {'yes' if r['stream'] else 'no'} | "
                f"failed: {r['error'][:60]} | | | | |"
            )
            continue
        lines.append(
            f"| {r['impl']} | {r['C']} | {r['T']} | {'yes' if r['stream'] else 'no'} | "
            f"{r['requests']} | {r['cpu_per_request_ms']:.2f} ms | "
            f"{r['cpu_per_token_us']:.1f} µs | {100 * r['client_cpu_share']:.0f} % | "
            f"{r['server_peak_running']} / {r['server_mean_running']:.1f} |"
        )
    return head + "\n".join(lines) + "\n"


def driver_main(args: argparse.Namespace) -> None:
    impls = [i for i in args.impls.split(",") if i]
    for impl in impls:
        if impl not in IMPLS:
            raise SystemExit(f"unknown client {impl!r}: one of {', '.join(IMPLS)}")
    if "after-uvloop" in impls:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            print("uvloop is not installed: skipping after-uvloop", file=sys.stderr)
            impls.remove("after-uvloop")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench_client_"))
    before_src = _extract(args.before_rev, tmp) if "before" in impls else None
    proc, url = _start_server(args)
    rows: list[dict[str, Any]] = []
    try:
        for stream in [m == "stream" for m in args.modes.split(",")]:
            for t in [int(x) for x in args.T.split(",")]:
                for c in [int(x) for x in args.concurrency.split(",")]:
                    budget = args.tokens_stream if stream else args.tokens
                    per_chain = max(1, round(budget / (c * t)))
                    for impl in impls:
                        rows.append(
                            _run_client(args, impl, url, c, t, stream, per_chain, before_src)
                        )
                        print(_table(rows[-1:]).splitlines()[-1], flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    table = _table(rows)
    (out / "results.md").write_text(table)
    print()
    print(table)


def _run_client(
    args: argparse.Namespace,
    impl: str,
    url: str,
    c: int,
    t: int,
    stream: bool,
    per_chain: int,
    before_src: Path | None,
) -> dict[str, Any]:
    env = dict(os.environ)
    paths = [str(ROOT)]
    if impl == "before" and before_src is not None:
        paths.insert(0, str(before_src))
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.bench_client",
        "--client",
        "--impl",
        impl,
        "--url",
        url,
        "--C",
        str(c),
        "--T",
        str(t),
        "--requests-per-chain",
        str(per_chain),
    ]
    if stream:
        cmd.append("--stream")
    if impl == "before" and before_src is not None:
        cmd += ["--before-src", str(before_src)]
    if args.cprofile:
        Path(args.cprofile).mkdir(parents=True, exist_ok=True)
        name = f"{impl}_C{c}_T{t}_{'stream' if stream else 'plain'}.prof"
        cmd += ["--cprofile", str(Path(args.cprofile) / name)]
    done = subprocess.run(
        cmd, cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return {"impl": impl, "C": c, "T": t, "stream": stream, "error": done.stderr[-2000:]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_client", description=__doc__)
    p.add_argument("--impls", default="before,after")
    p.add_argument("--concurrency", default="10,100,1000")
    p.add_argument("--T", default="64,512")
    p.add_argument("--modes", default="plain,stream")
    p.add_argument("--tokens", type=int, default=200_000, help="tokens per non-streaming run")
    p.add_argument("--tokens-stream", type=int, default=100_000, help="tokens per streaming run")
    p.add_argument("--before-rev", default="47b0348")
    p.add_argument("--profile", default="gpu")
    p.add_argument("--time-scale", type=float, default=0.25)
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--out", default="/tmp/bench_client")
    p.add_argument("--cprofile", default=None, help="folder for a cProfile of each client run")
    # Internal: one client run.
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", default="after", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--C", type=int, default=10, help=argparse.SUPPRESS)
    p.add_argument("--requests-per-chain", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--before-src", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.client:
        args.T = int(args.T)
        client_main(args)
    else:
        driver_main(args)


if __name__ == "__main__":
    main()
