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

3. **Health under load** (``health``): ``presto serve`` (its own process, the default limits)
   in front of ``benchmarks.latency_server`` (its own process), ``--clients`` clients posting
   requests at the defaults' bounds (``--n`` chains on each of 4 prompts, ``--max-tokens``,
   ``--steps``) for ``--seconds``, while a prober asks ``/health`` every 50 ms: its latency
   p50/p99/max, the requests served, and the service's memory before, at the peak and after.

Run: ``python -m benchmarks.bench_serve overhead``,
``python -m benchmarks.bench_serve load --clients 1 64`` and
``python -m benchmarks.bench_serve health``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
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
            await run_chain(engine, (1, 2, 3), sampler, traversal="stream", size=4, seed=s)
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


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _wait_healthy(url: str, process: subprocess.Popen[bytes], limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the process exited ({process.returncode})")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url}: not healthy within {limit_s:g} s")


async def _health_under_load(
    url: str, upstream_url: str, body: dict[str, Any], clients: int, seconds: float, pid: int
) -> dict[str, Any]:
    stop = time.monotonic() + seconds
    health: list[float] = []
    control: list[float] = []
    served: list[float] = []
    failed: list[int] = []
    peak = [_rss_mb(pid)]
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one(c: int) -> None:
            i = 0
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                r = await client.post("/v1/completions", json={**body, "seed": c * 100_000 + i})
                (served if r.status_code == 200 else failed).append(
                    time.perf_counter() - t0 if r.status_code == 200 else r.status_code
                )
                i += 1

        async def probe() -> None:
            # (the upstream's own /health, probed the same way: what this machine's load
            # costs any server's answer, presto's or not)
            async with httpx.AsyncClient(timeout=60) as prober:
                while time.monotonic() < stop:
                    for where, into in ((url, health), (upstream_url, control)):
                        t0 = time.perf_counter()
                        r = await prober.get(f"{where}/health")
                        into.append(time.perf_counter() - t0)
                        if r.status_code != 200:
                            failed.append(r.status_code)
                    peak.append(_rss_mb(pid))
                    await asyncio.sleep(0.05)

        # Requests still running at the end are cut (the service answers them as cancelled).
        tasks = [asyncio.ensure_future(one(c)) for c in range(clients)]
        await probe()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    health.sort()
    control.sort()
    return {
        "health_probes": len(health),
        "upstream_health_p99_ms": 1000 * control[min(len(control) - 1, int(0.99 * len(control)))],
        "health_p50_ms": 1000 * statistics.median(health),
        "health_p99_ms": 1000 * health[min(len(health) - 1, int(0.99 * len(health)))],
        "health_max_ms": 1000 * health[-1],
        "requests_served": len(served),
        "request_p50_s": statistics.median(served) if served else None,
        "not_200": sorted(set(failed)),
        "rss_peak_mb": max(peak),
    }


def health(
    clients: int, n: int, max_tokens: int, steps: int, seconds: float, profile: str, bursts: int
) -> dict[str, Any]:
    from presto_client.child_servers.ports import free_port

    up_port, port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "serve.yaml"
        config.write_text(
            json.dumps(
                {
                    "name": "bench-serve-health",
                    "engines": [
                        {"kind": "vllm", "name": "lat", "base_url": f"http://127.0.0.1:{up_port}"}
                    ],
                    "prompts": {"token_ids": [[1, 2, 3]]},
                    "sampler": {"alpha": 4.0, "block_size": 16, "traversals": ["stream"]},
                    "output_dir": str(Path(tmp) / "unused"),
                }
            )
        )
        upstream = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.latency_server",
                "--profile",
                profile,
                "--port",
                str(up_port),
                "--max-logprobs",
                "-1",
            ]
        )
        presto = Path(sys.executable).with_name("presto")
        service = subprocess.Popen([str(presto), "serve", str(config), "--port", str(port)])
        try:
            _wait_healthy(f"http://127.0.0.1:{up_port}", upstream)
            url = f"http://127.0.0.1:{port}"
            _wait_healthy(url, service)
            before = _rss_mb(service.pid)
            num_blocks = max(1, max_tokens // 16)
            body = {
                "model": "lat",
                "prompt": [[1 + p, 2, 3] for p in range(4)],
                "n": n,
                "max_tokens": max_tokens,
                "num_blocks": num_blocks,
                "steps_per_block": steps,
            }
            upstream_url = f"http://127.0.0.1:{up_port}"
            # Bursts one after the other: memory after each says whether it returns, or at
            # least stays bounded, burst after burst.
            after: list[float] = []
            for _ in range(bursts):
                out = asyncio.run(
                    _health_under_load(url, upstream_url, body, clients, seconds, service.pid)
                )
                time.sleep(5)
                after.append(_rss_mb(service.pid))
            gauges = {
                line.split()[0]: float(line.split()[1])
                for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines()
                if line.split() and line.split()[0].endswith(("active_requests", "in_flight"))
            }
            out.update(
                after_5s=gauges,
                clients=clients,
                chains_per_request=4 * n,
                max_tokens=max_tokens,
                steps_per_block=steps,
                rss_before_mb=before,
                rss_after_each_burst_mb=after,
            )
            return out
        finally:
            for p in (service, upstream):
                p.terminate()
                p.wait(timeout=30)


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
    h = sub.add_parser("health")
    h.add_argument("--clients", type=int, default=64, help="the default --max-active")
    h.add_argument("--n", type=int, default=16, help="chains per prompt (4 prompts; max_n 16)")
    h.add_argument("--max-tokens", type=int, default=256)
    h.add_argument("--steps", type=int, default=8, help="steps_per_block")
    h.add_argument("--seconds", type=float, default=30.0)
    h.add_argument("--profile", default="gpu")
    h.add_argument("--bursts", type=int, default=1, help="loads one after the other")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.what == "overhead":
        result: Any = overhead(args.requests)
    elif args.what == "health":
        result = health(
            args.clients,
            args.n,
            args.max_tokens,
            args.steps,
            args.seconds,
            args.profile,
            args.bursts,
        )
    else:
        result = load(args.clients, args.seconds, args.profile, args.time_scale)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
