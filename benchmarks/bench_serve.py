"""What ``presto serve`` costs: overhead per request against a direct ``run_chain``, and
latency percentiles under concurrent clients against the latency-model server.

1. **Overhead** (``overhead``): the same chain (reference engine, in-process, no latency) run
   ``--requests`` times directly with :func:`run_chain` and through the service (an httpx
   client posting ``/v1/completions``, the service on its own loop in a thread of this process).
   Reported per request: wall time, and process CPU (client, service and chain together) so
   that the difference is what the HTTP face adds.
2. **Saturation** (``load``): ``--clients`` concurrent clients (1, 64, ...) each posting requests
   back to back for ``--seconds`` against the service in front of
   ``benchmarks.latency_server`` (``--profile``, ``--time-scale``); requests per second and
   p50/p99 latency.

Run: ``python -m benchmarks.bench_serve overhead`` and
``python -m benchmarks.bench_serve load --clients 1 64``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.latency_server import LatencyServer, ServerThread
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.runners import run_chain
from presto_client.orchestration.config.loading import validate_job_config
from presto_client.serve.app import ServeOptions
from tests.serve.serve_helpers import ServiceThread

SAMPLER = {
    "alpha": 4.0,
    "block_size": 8,
    "num_blocks": 2,
    "steps_per_block": 4,
    "traversals": ["stream"],
    "window": 4,
}


def _config(engine: dict[str, Any], max_concurrency: int = 256) -> Any:
    return validate_job_config(
        {
            "name": "bench-serve",
            "engines": [engine],
            "prompts": {"token_ids": [[1, 2, 3]]},
            "sampler": SAMPLER,
            "seed": 0,
            "output_dir": "/tmp/bench-serve-unused",
            "max_concurrency": max_concurrency,
        }
    )


def overhead(requests: int) -> dict[str, Any]:
    cfg = _config({"kind": "reference", "name": "ref", "vocab_size": 64, "max_concurrency": 16})
    sampler = cfg.sampler.to_sampler_config(None)

    async def direct() -> tuple[float, float]:
        engine = ReferenceEngine(ReferenceModel(64), name="ref")
        wall, cpu = time.perf_counter(), time.process_time()
        for s in range(requests):
            await run_chain(engine, (1, 2, 3), sampler, traversal="stream", n_pf=4, seed=s)
        return time.perf_counter() - wall, time.process_time() - cpu

    d_wall, d_cpu = asyncio.run(direct())
    with ServiceThread(cfg, ServeOptions(port=0)) as service, httpx.Client(timeout=60) as client:
        body = {"model": "ref", "prompt": [1, 2, 3], "traversal": "stream"}
        client.post(f"{service.url}/v1/completions", json={**body, "seed": 0})  # warm up
        wall, cpu = time.perf_counter(), time.process_time()
        for s in range(requests):
            r = client.post(f"{service.url}/v1/completions", json={**body, "seed": s})
            r.raise_for_status()
        s_wall, s_cpu = time.perf_counter() - wall, time.process_time() - cpu
    ms = 1000 / requests
    return {
        "requests": requests,
        "direct_wall_ms": d_wall * ms,
        "direct_cpu_ms": d_cpu * ms,
        "serve_wall_ms": s_wall * ms,
        "serve_cpu_ms": s_cpu * ms,
        "overhead_wall_ms": (s_wall - d_wall) * ms,
        "overhead_cpu_ms": (s_cpu - d_cpu) * ms,
    }


async def _clients(url: str, clients: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    stop = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one(c: int) -> None:
            i = 0
            while time.monotonic() < stop:
                body = {"model": "lat", "prompt": [1 + c % 50, 2, 3], "seed": c * 100_000 + i}
                t0 = time.perf_counter()
                r = await client.post("/v1/completions", json=body)
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {r.text}")
                latencies.append(time.perf_counter() - t0)
                i += 1

        await asyncio.gather(*(one(c) for c in range(clients)))
    return latencies


def load(clients: list[int], seconds: float, profile: str, time_scale: float) -> list[dict]:
    out = []
    with ServerThread(LatencyServer(profile, time_scale=time_scale, max_logprobs=-1)) as upstream:
        engine = {
            "kind": "vllm",
            "name": "lat",
            "base_url": upstream.base_url,
            "max_concurrency": 256,
            "probe": False,
        }
        options = ServeOptions(port=0, max_active=1024, max_queue=1024)
        with ServiceThread(_config(engine), options) as service:
            for n in clients:
                t0 = time.perf_counter()
                lat = sorted(asyncio.run(_clients(service.url, n, seconds)))
                wall = time.perf_counter() - t0
                out.append(
                    {
                        "clients": n,
                        "requests": len(lat),
                        "rps": len(lat) / wall,
                        "p50_s": statistics.median(lat),
                        "p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
                    }
                )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_serve")
    sub = parser.add_subparsers(dest="what", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--requests", type=int, default=200)
    lo = sub.add_parser("load")
    lo.add_argument("--clients", type=int, nargs="+", default=[1, 64])
    lo.add_argument("--seconds", type=float, default=10.0)
    lo.add_argument("--profile", default="gpu")
    lo.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.what == "overhead":
        result: Any = overhead(args.requests)
    else:
        result = load(args.clients, args.seconds, args.profile, args.time_scale)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
