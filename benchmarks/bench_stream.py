"""Side-by-side speed benchmark of the traversals against the latency-model server.

One command starts ``benchmarks.latency_server`` in a subprocess (its CPU apart from the
client's), then runs the arms interleaved chain by chain (per prompt: every arm in turn, same
prompt and seeds) through the project's real HTTP client, and reports per arm: speedup over
``sequential`` (median and [min–max] over prompts) from the chains' model-call time and from
their wall time, transitions per call, tokens generated relative to ``sequential``, requests
cancelled, early rejections and the tokens they saved, the server's peak and mean running
sequences, and throughput (transitions per second) with the mean chain latency.

    .venv/bin/python -m benchmarks.bench_stream --profile gpu --time-scale 0.5 --T 1024 --K 50

Writes ``results.json``, ``results.md`` and ``speedup.png`` (speedup vs W / N_pf per arm) under
``--out``. Arms whose traversal is not registered in
``presto_client.core.sampler_config.TRAVERSALS`` are skipped with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from backends import EngineSpec, create_engine
from presto_client.core.kernels import make_kernel
from presto_client.core.runners import ChainResult, chain_budget, run_chain
from presto_client.core.sampler_config import TRAVERSALS, SamplerConfig
from presto_client.core.speculation import DEFAULT_TOLERANCE
from presto_client.reporting.tables import format_stream_waits

ROOT = Path(__file__).resolve().parents[1]
ALL_ARMS = ("sequential", "bfs", "predictive", "crn", "stream")


@dataclass
class Arm:
    traversal: str
    n_pf: int | None
    """W / N_pf; ``None``: the method's default (``stream``: no cap, the engine sizes it)."""

    @property
    def name(self) -> str:
        if self.traversal == "sequential":
            return self.traversal
        return f"{self.traversal}@{'auto' if self.n_pf is None else self.n_pf}"


@dataclass
class Block:
    """One arm on one prompt: ``chains`` chains run concurrently."""

    arm: str
    traversal: str
    n_pf: int | None
    prompt: int
    wall_s: float
    chains: list[dict[str, Any]] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)

    def total(self, key: str) -> float:
        """Sum of a statistic over the chains that finished (failed ones have no stats)."""
        return float(sum(c["stats"][key] for c in self.chains if "stats" in c))


class LatencyServerProcess:
    """``python -m benchmarks.latency_server`` in a subprocess (a context manager)."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""

    def __enter__(self) -> LatencyServerProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.latency_server", "--port", "0", *self.args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if " on http://" not in line:
            self.proc.kill()
            raise RuntimeError(f"the latency server did not start: {line!r}")
        print(line.strip(), flush=True)
        self.base_url = line.strip().rsplit(" on ", 1)[1]
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def make_prompts(count: int, length: int, vocab: int, seed: int) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    return [tuple(rng.randrange(vocab) for _ in range(length)) for _ in range(count)]


def sampler_config(name: str, alpha: float, T: int, K: int) -> SamplerConfig:
    return SamplerConfig(
        sampler=name,  # type: ignore[arg-type]
        alpha=alpha,
        block_size=T,
        num_blocks=1,
        steps_per_block=K,
    )


def chain_record(result: ChainResult, seed: int, wall_s: float) -> dict[str, Any]:
    return {
        "seed": seed,
        "wall_s": wall_s,
        "stats": result.stats.as_dict(),
        "tokens": list(result.full_token_ids),
    }


async def run_block(
    base_url: str,
    arm: Arm,
    prompt_index: int,
    prompt: tuple[int, ...],
    sampler: SamplerConfig,
    chains: int,
    seed: int,
    spec_kw: dict[str, Any],
    tolerance: float = DEFAULT_TOLERANCE,
) -> Block:
    engine = create_engine(EngineSpec("vllm", (base_url,), **spec_kw))
    # One budget for the block's chains, as the engine's owner holds one per replica in a job.
    budget = chain_budget(engine)
    budget.tolerance = tolerance  # an engine's speculation_tolerance in a job config
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as control:
        await control.post("/stats/reset")

        async def one(c: int) -> dict[str, Any]:
            t0 = time.perf_counter()
            try:
                result = await run_chain(
                    engine,
                    prompt,
                    sampler,
                    traversal=arm.traversal,
                    n_pf=arm.n_pf,
                    seed=seed + c,
                    budget=budget,
                )
            except Exception as exc:  # one failed chain does not end the benchmark
                print(f"chain {arm.name} prompt {prompt_index} seed {seed + c} failed: {exc!r}")
                return {
                    "seed": seed + c,
                    "wall_s": time.perf_counter() - t0,
                    "error": repr(exc),
                    "traceback": traceback.format_exc(),
                }
            return chain_record(result, seed + c, time.perf_counter() - t0)

        t0 = time.perf_counter()
        try:
            records = await asyncio.gather(*(one(c) for c in range(chains)))
        finally:
            await engine.aclose()
        wall = time.perf_counter() - t0
        server = (await control.get("/stats")).json()
    return Block(arm.name, arm.traversal, arm.n_pf, prompt_index, wall, list(records), server)


def _med_range(values: list[float]) -> dict[str, float]:
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(blocks: list[Block], arms: list[Arm]) -> list[dict[str, Any]]:
    base = {b.prompt: b for b in blocks if b.traversal == "sequential"}
    rows = []
    for arm in arms:
        mine = [b for b in blocks if b.arm == arm.name]
        if not mine:
            continue
        call_sp, wall_sp, tok_rel, srv_rel, replays, failed = [], [], [], [], 0, 0
        for b in mine:
            ref = base.get(b.prompt)
            if ref is None:
                continue
            ok = [
                i
                for i, (c, r) in enumerate(zip(b.chains, ref.chains, strict=True))
                if "stats" in c and "stats" in r
            ]
            failed += len(b.chains) - len(ok)
            if not ok:
                continue

            def paired(chains: list[dict[str, Any]], key: str, ok: list[int] = ok) -> float:
                return float(sum(chains[i]["stats"][key] for i in ok))

            call_sp.append(
                paired(ref.chains, "model_call_time_s")
                / max(paired(b.chains, "model_call_time_s"), 1e-9)
            )
            ref_wall = sum(ref.chains[i]["wall_s"] for i in ok)
            wall_sp.append(ref_wall / max(sum(b.chains[i]["wall_s"] for i in ok), 1e-9))
            ref_tokens = max(paired(ref.chains, "tokens_generated"), 1.0)
            tok_rel.append(paired(b.chains, "tokens_generated") / ref_tokens)
            srv_rel.append(
                b.server.get("tokens_generated", 0) / max(ref.server.get("tokens_generated", 0), 1)
            )
            replays += sum(b.chains[i]["tokens"] == ref.chains[i]["tokens"] for i in ok)
        transitions = sum(b.total("transitions") for b in mine)
        calls = sum(b.total("rounds") for b in mine)
        wall = sum(b.wall_s for b in mine)
        n_chains = sum(len(b.chains) for b in mine)
        rows.append(
            {
                "arm": arm.name,
                "traversal": arm.traversal,
                "n_pf": arm.n_pf,
                "chains": n_chains,
                "model_call_time_s": sum(b.total("model_call_time_s") for b in mine),
                "wall_s": wall,
                "speedup_calls": _med_range(call_sp),
                "speedup_wall": _med_range(wall_sp),
                "transitions_per_call": transitions / calls if calls else 0.0,
                "tokens_vs_sequential": _med_range(tok_rel),
                "server_tokens_vs_sequential": _med_range(srv_rel),
                "requests_cancelled": sum(b.total("requests_cancelled") for b in mine),
                "early_rejects": sum(b.total("early_rejects") for b in mine),
                "tokens_saved_early": sum(b.total("tokens_saved_early") for b in mine),
                "budget_wait_s": sum(b.total("budget_wait_s") for b in mine),
                "rewrite_wait_s": sum(b.total("rewrite_wait_s") for b in mine),
                "floor_wait_s": sum(b.total("floor_wait_s") for b in mine),
                "budget_refusals": sum(b.total("budget_refusals") for b in mine),
                "slot_refusals": sum(b.total("slot_refusals") for b in mine),
                "replays_sequential": f"{replays}/{n_chains}",
                "failed_chains": failed,
                "throughput_tps": transitions / wall if wall else 0.0,
                "mean_chain_latency_s": statistics.mean(
                    [c["wall_s"] for b in mine for c in b.chains if "stats" in c] or [0.0]
                ),
                "server_peak_running": max(b.server.get("peak_running", 0) for b in mine),
                "server_mean_running": statistics.mean(
                    b.server.get("mean_running", 0.0) for b in mine
                ),
                "server_aborted": sum(b.server.get("aborted", 0) for b in mine),
                "server_starved_share": max(b.server.get("starved_share", 0.0) for b in mine),
                "server_dropped_s": sum(b.server.get("dropped_s", 0.0) for b in mine),
            }
        )
    return rows


def _fmt_range(r: dict[str, float]) -> str:
    return f"{r['median']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]"


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [
        header,
        "",
        "| arm | speedup (end to end) | speedup (model-call time) | trans/call | tokens vs seq "
        "(client/server) | cancelled | early rej. | tokens saved | replays seq | trans/s "
        "| mean chain s | server peak/mean running | starved | clock dropped s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {_fmt_range(r['speedup_wall'])} | {_fmt_range(r['speedup_calls'])} "
            f"| {r['transitions_per_call']:.2f} | {r['tokens_vs_sequential']['median']:.2f}x / "
            f"{r['server_tokens_vs_sequential']['median']:.2f}x "
            f"| {r['requests_cancelled']:.0f} | {r['early_rejects']:.0f} "
            f"| {r['tokens_saved_early']:.0f} | {r['replays_sequential']} "
            f"| {r['throughput_tps']:.2f} | {r['mean_chain_latency_s']:.2f} "
            f"| {r['server_peak_running']}/{r['server_mean_running']:.1f} "
            f"| {r['server_starved_share']:.1%} | {r['server_dropped_s']:.1f} |"
        )
    waits = format_stream_waits(rows)
    return "\n".join(lines) + "\n" + (f"\n{waits}\n" if waits else "")


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (extra 'plots'): no plot", flush=True)
        return False
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for traversal in ALL_ARMS[1:]:
        mine = sorted(
            (r for r in rows if r["traversal"] == traversal and r["n_pf"] is not None),
            key=lambda r: r["n_pf"],
        )
        if not mine:
            continue
        xs = [r["n_pf"] for r in mine]
        ys = [r["speedup_wall"]["median"] for r in mine]
        lo = [r["speedup_wall"]["median"] - r["speedup_wall"]["min"] for r in mine]
        hi = [r["speedup_wall"]["max"] - r["speedup_wall"]["median"] for r in mine]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=traversal)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("W (stream) / N_pf (rounds)")
    ax.set_ylabel("speedup over sequential (wall, median [range])")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


async def bench(args: argparse.Namespace, base_url: str) -> dict[str, Any]:
    sampler = sampler_config(args.sampler, args.alpha, args.T, args.K)
    prompts = make_prompts(args.prompts, args.prompt_len, args.vocab_size, args.seed)
    arms: list[Arm] = []
    for name in args.arms.split(","):
        if name not in TRAVERSALS:
            print(f"note: traversal {name!r} is not registered (TRAVERSALS={TRAVERSALS}): skipped")
            continue
        if name == "sequential":
            arms.append(Arm(name, 1))
        else:
            arms.extend(Arm(name, n) for n in args.n_pf)
    # An uncapped window may keep every transition of the block in flight, each proposal with
    # its sequences (MultiTryMH: one request per try).
    sizes = [n for n in args.n_pf if n is not None]
    per = make_kernel(sampler).sequences_per_proposal
    max_conc = args.max_concurrency or max(32, args.chains * max([*sizes, args.K]) * per)
    spec_kw = {"top_k": args.top_k, "max_concurrency": max_conc, "request_timeout_s": 3600.0}
    probe = create_engine(EngineSpec("vllm", (base_url,), **spec_kw))
    try:
        report = await probe.probe()
        if not report.ok:
            raise RuntimeError(f"probe failed: {report.problems}")
    finally:
        await probe.aclose()
    blocks: list[Block] = []
    partial: Path | None = None
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        partial = args.out / "blocks.partial.jsonl"
        partial.write_text("")
    t_start = time.perf_counter()
    for p, prompt in enumerate(prompts):
        for arm in arms:
            block = await run_block(
                base_url,
                arm,
                p,
                prompt,
                sampler,
                args.chains,
                args.seed + 1000 * p,
                spec_kw,
                args.speculation_tolerance,
            )
            blocks.append(block)
            if partial is not None:  # what a killed run leaves behind
                with partial.open("a") as fh:
                    fh.write(json.dumps(block.__dict__) + "\n")
            print(
                f"prompt {p} {arm.name:>14}: wall {block.wall_s:7.2f} s, model-call "
                f"{block.total('model_call_time_s'):7.2f} s, transitions "
                f"{block.total('transitions'):.0f}, calls {block.total('rounds'):.0f}, "
                f"server peak {block.server.get('peak_running')}, starved "
                f"{block.server.get('starved_share', 0):.1%}",
                flush=True,
            )
    rows = summarise(blocks, arms)
    return {
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "total_wall_s": time.perf_counter() - t_start,
        "rows": rows,
        "blocks": [b.__dict__ for b in blocks],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_stream",
        description="Traversals side by side on the latency-model server (arms interleaved).",
    )
    parser.add_argument("--profile", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--time-scale", type=float, default=0.5)
    parser.add_argument("--stream-interval", type=int, default=1)
    parser.add_argument(
        "--model",
        choices=("reference", "windowed"),
        default="windowed",
        help="the server's model: windowed (O(1) per token, default: keeps up with a GPU-speed "
        "clock here) or reference (hashes the whole context)",
    )
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--T", type=int, default=1024, help="block size (one block)")
    parser.add_argument("--K", type=int, default=50, help="MH steps")
    parser.add_argument("--alpha", type=float, default=4.0)
    parser.add_argument(
        "--sampler", choices=("power_mh", "entropy_cut", "multi_try_mh"), default="power_mh"
    )
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--chains", type=int, default=1, help="concurrent chains per arm")
    parser.add_argument(
        "--n-pf",
        type=lambda s: [None if x == "auto" else int(x) for x in s.split(",")],
        default=[8],
        help="comma-separated W / N_pf values (a sweep); 'auto': the method's default (stream: "
        "no cap, the engine's budget sizes the window; rounds: N_pf 8)",
    )
    parser.add_argument("--arms", default=",".join(ALL_ARMS))
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help="requests in flight to the server (default: room for every transition's proposal, "
        "max(32, chains x max(W, K) x sequences per proposal))",
    )
    parser.add_argument(
        "--speculation-tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help="the engine's speculation_tolerance: how much speculative proposals may slow a "
        f"decode step (default {DEFAULT_TOLERANCE})",
    )
    parser.add_argument("--vocab-size", type=int, default=64)
    parser.add_argument(
        "--max-logprobs",
        type=int,
        default=-1,
        help="server's --max-logprobs (-1: the vocabulary, so an ambiguous decision can be "
        "tightened by exact scoring instead of failing its chain)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-url", default=None, help="use a running latency server")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_stream"))
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    server_args = [
        "--profile",
        args.profile,
        "--time-scale",
        str(args.time_scale),
        "--stream-interval",
        str(args.stream_interval),
        "--vocab-size",
        str(args.vocab_size),
        "--max-model-len",
        str(max(4096, args.prompt_len + args.T + 1)),
        "--max-logprobs",
        str(args.max_logprobs),
    ]
    if args.max_num_seqs is not None:
        server_args += ["--max-num-seqs", str(args.max_num_seqs)]
    server_args += ["--model", args.model]
    if args.server_url:
        result = asyncio.run(bench(args, args.server_url))
    else:
        with LatencyServerProcess(server_args) as server:
            result = asyncio.run(bench(args, server.base_url))
    args.out.mkdir(parents=True, exist_ok=True)
    title = (
        f"{args.profile} profile (time_scale {args.time_scale}), {args.sampler} alpha={args.alpha},"
        f" T={args.T}, K={args.K}, {args.prompts} prompts x {args.chains} chains"
    )
    table = markdown(result["rows"], f"**{title}**")
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "results.md").write_text(table)
    plotted = plot(result["rows"], args.out / "speedup.png", title)
    print()
    print(table)
    print(
        f"total {result['total_wall_s']:.0f} s; wrote {args.out / 'results.json'}, "
        f"{args.out / 'results.md'}" + (f", {args.out / 'speedup.png'}" if plotted else "")
    )


if __name__ == "__main__":
    main()
