"""The local executor against the Ray executor on one machine, and a Ray worker killed mid-run.

One command starts the latency-model server (``benchmarks.latency_server``, vLLM dialect, in a
subprocess: its CPU is not the client's) and runs the same job of ``--chains`` streaming chains
(traversal ``stream``) three times, each in a fresh client process, one after another:

``local``     ``executor: {kind: local}``: one asyncio process;
``ray``       ``executor: {kind: ray, workers: W}``: a local Ray instance of its own, W actors;
``ray-kill``  as ``ray``, with worker 0's actor killed (``ray.kill``) once a quarter of the
              chains has finished: its unfinished chains are rerun by the others.

Per arm: wall time (the job, Ray's start included, and the chains' part: from the run directory's
opening, the executor up, to the end), the client's CPU per request (the driver's ``getrusage``
plus every worker's that closed in order, start-up included, over the server's count of requests
in the chains' window; a killed worker's CPU is lost with it), peak RSS per process
(driver and each worker), Ray's own processes' CPU (GCS, raylet, ... reaped by the driver:
``RUSAGE_CHILDREN``), the server's peak and mean running sequences over the chains' window, and
the checks: every chain
once in samples.jsonl, and the same tokens as ``local`` chain by chain.

    .venv/bin/python -m benchmarks.bench_executor --chains 4000 --workers 2

Writes ``results.json`` and ``results.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("local", "ray", "ray-kill")
PROMPT_LEN = 32
CHAINS_PER_PROMPT = 4


def _job(args: argparse.Namespace, arm: str, out: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    prompts = [
        [rng.randrange(1, args.vocab_size) for _ in range(PROMPT_LEN)]
        for _ in range(max(1, args.chains // CHAINS_PER_PROMPT))
    ]
    executor: dict[str, Any] = {"kind": "local"}
    if arm != "local":
        executor = {"kind": "ray", "workers": args.workers, "connect_timeout_s": 120}
    return {
        "name": f"bench-executor-{arm}",
        "engines": [
            {
                "kind": "vllm",
                "name": "lat",
                "base_url": args.base_url,
                "max_concurrency": args.concurrency,
            }
        ],
        "prompts": {"token_ids": prompts},
        "sampler": {
            "sampler": "power_mh",
            "alpha": 4.0,
            "block_size": args.block_size,
            "num_blocks": args.num_blocks,
            "steps_per_block": args.steps,
            "traversals": ["stream"],
            "window": args.window,
        },
        "chains_per_prompt": CHAINS_PER_PROMPT,
        "seed": args.seed,
        "output_dir": str(out),
        "max_concurrency": args.concurrency,
        "max_failed_chains": 0,
        "executor": executor,
    }


class _KillWorkerZero:
    """A sink that kills worker 0's actor once ``after`` chains have finished."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.seen = 0
        self.killed_at: float | None = None

    def chain_started(self, spec: Any, replica: int) -> None:
        return None

    def round_done(self, spec: Any, record: Any, queue_s: float) -> None:
        return None

    def chain_done(self, outcome: Any) -> None:
        self.seen += 1
        if self.seen == self.after and self.killed_at is None:
            import ray

            from presto_client.orchestration.executors.ray_executor import WORKER_NAME

            ray.kill(ray.get_actor(WORKER_NAME.format(index=0)))
            self.killed_at = time.perf_counter()


def _rusage_cpu(who: int) -> tuple[float, float]:
    u = resource.getrusage(who)
    return u.ru_utime + u.ru_stime, u.ru_maxrss / 1024


def child_main(args: argparse.Namespace) -> None:
    """One arm in this (fresh) process; prints its measurements as one JSON line."""
    from presto_client.orchestration.config.loading import validate_job_config
    from presto_client.orchestration.job import run_job
    from presto_client.orchestration.planning.plan import make_plan
    from presto_client.orchestration.prompts.prompt_rows import load_prompts

    out = Path(args.run_dir)
    cfg = validate_job_config(_job(args, args.child, out))
    plan = make_plan(cfg, load_prompts(cfg))
    killer = _KillWorkerZero(max(1, args.chains // 4)) if args.child == "ray-kill" else None
    started: list[float] = []

    def on_start(total: int, finished: int) -> None:
        # the executor is up (Ray and its workers started): the chains' window starts here
        httpx.post(f"{args.base_url}/stats/reset", timeout=10)
        started.append(time.perf_counter())

    t0 = time.perf_counter()
    result = run_job(plan, sinks=[killer] if killer else [], probe=True, on_start=on_start)
    wall = time.perf_counter() - t0
    chains_wall = time.perf_counter() - started[0]
    killed_after = killer.killed_at - started[0] if killer and killer.killed_at else None
    cpu, rss = _rusage_cpu(resource.RUSAGE_SELF)
    ray_cpu, ray_rss = _rusage_cpu(resource.RUSAGE_CHILDREN)
    print(
        json.dumps(
            {
                "arm": args.child,
                "wall_s": wall,
                "chains_wall_s": chains_wall,
                "startup_s": wall - chains_wall,
                "completed": result.completed,
                "failed": result.failed,
                "driver_cpu_s": cpu,
                "driver_peak_rss_mb": rss,
                "ray_processes_cpu_s": ray_cpu,
                "ray_processes_peak_rss_mb": ray_rss,
                "workers": result.workers,
                "killed_after_s": killed_after,
            }
        ),
        flush=True,
    )


def _start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    from benchmarks import latency_server  # (not at import: the child processes skip it)

    options = ["--profile", "gpu", "--time-scale", str(args.time_scale)]
    options += ["--vocab-size", str(args.vocab_size), "--model", "windowed"]
    # (the whole vocabulary's logprobs: an ambiguous decision is scored exactly)
    options += ["--max-logprobs", "-1"]
    if args.max_num_seqs:
        options += ["--max-num-seqs", str(args.max_num_seqs)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return latency_server.spawn(options, cwd=ROOT, env=env)


def _samples(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "samples.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run_arm(args: argparse.Namespace, arm: str, url: str, run_dir: Path) -> dict[str, Any]:
    httpx.post(f"{url}/stats/reset", timeout=10)
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.bench_executor",
        "--child",
        arm,
        "--run-dir",
        str(run_dir),
        "--base-url",
        url,
        *_passed(args),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=7200)
    if proc.returncode != 0:
        raise SystemExit(f"arm {arm} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    row: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    stats = httpx.get(f"{url}/stats", timeout=10).json()
    row["server"] = {
        k: stats.get(k)
        for k in ("requests", "peak_running", "mean_running", "mean_running_busy", "dropped_s")
    }
    workers_cpu = sum(w["cpu_s"] for w in row["workers"])
    requests = max(1, int(stats.get("requests") or 0))
    row["client_cpu_s"] = row["driver_cpu_s"] + workers_cpu
    row["client_cpu_ms_per_request"] = 1e3 * row["client_cpu_s"] / requests
    row["client_cpu_ms_per_request_with_ray"] = (
        1e3 * (row["client_cpu_s"] + row["ray_processes_cpu_s"]) / requests
    )
    samples = _samples(run_dir)
    ids = [s["chain_id"] for s in samples]
    row["samples"] = len(ids)
    row["duplicates"] = len(ids) - len(set(ids))
    row["tokens"] = {s["chain_id"]: s.get("token_ids") for s in samples}
    return row


def _passed(args: argparse.Namespace) -> list[str]:
    return [
        "--chains",
        str(args.chains),
        "--workers",
        str(args.workers),
        "--concurrency",
        str(args.concurrency),
        "--block-size",
        str(args.block_size),
        "--num-blocks",
        str(args.num_blocks),
        "--steps",
        str(args.steps),
        "--window",
        str(args.window),
        "--seed",
        str(args.seed),
        "--vocab-size",
        str(args.vocab_size),
    ]


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| arm | chains ok | dup | same tokens as local | wall s (start + chains) | requests | "
        "client CPU ms/req "
        "(+Ray's processes) | peak RSS MB: driver; workers | server running peak / mean |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        workers = ", ".join(f"{w['peak_rss_mb']:.0f}" for w in r["workers"]) or "-"
        lines.append(
            f"| {r['arm']} | {r['completed']} | {r['duplicates']} | {r['same_as_local']} | "
            f"{r['wall_s']:.1f} ({r['startup_s']:.1f} + {r['chains_wall_s']:.1f}) | "
            f"{r['server']['requests']} | "
            f"{r['client_cpu_ms_per_request']:.2f} ({r['client_cpu_ms_per_request_with_ray']:.2f})"
            f" | {r['driver_peak_rss_mb']:.0f}; {workers} | "
            f"{r['server']['peak_running']} / {r['server']['mean_running']:.1f} |"
        )
    return "\n".join(lines)


def driver_main(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    proc, url = _start_server(args)
    rows: list[dict[str, Any]] = []
    try:
        for arm in args.arms.split(","):
            run_dir = out / f"run-{arm}"
            if run_dir.exists():
                import shutil

                shutil.rmtree(run_dir)
            print(f"== {arm}", flush=True)
            rows.append(_run_arm(args, arm, url, run_dir))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    local = next((r["tokens"] for r in rows if r["arm"] == "local"), None)
    for r in rows:
        r["same_as_local"] = None if local is None else r["tokens"] == local
        r.pop("tokens")
    header = (
        f"{args.chains} chains (traversal stream, W={args.window}, {args.num_blocks}x"
        f"{args.block_size} tokens, {args.steps} steps/block), max_concurrency "
        f"{args.concurrency}, {args.workers} Ray workers; latency server gpu x{args.time_scale}"
    )
    md = f"{header}\n\n{_table(rows)}\n"
    (out / "results.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    (out / "results.md").write_text(md)
    print(md)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_executor", description=__doc__)
    p.add_argument("--chains", type=int, default=4000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=512, help="job and engine max_concurrency")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=1)
    p.add_argument("--steps", type=int, default=4, help="steps per block")
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=int, default=64)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--out", default="results/bench_executor")
    p.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    p.add_argument("--base-url", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.child:
        child_main(args)
    else:
        driver_main(args)


if __name__ == "__main__":
    main()
