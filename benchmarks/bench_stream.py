"""Side-by-side speed benchmark of the traversals against the latency-model server.

One command starts ``benchmarks.latency_server`` in a subprocess (its CPU apart from the
client's), then runs the arms interleaved chain by chain (per prompt: every arm in turn, same
prompt and seeds) through the project's real HTTP client, and reports per arm: speedup over
``sequential`` (median and [min–max] over prompts) from the chains' model-call time and from
their wall time, transitions per call, tokens generated relative to ``sequential``, requests
cancelled, early rejections and the tokens they saved, the server's peak and mean running
sequences, and throughput (transitions per second) with the mean chain latency.

    .venv/bin/python -m benchmarks.bench_stream --profile gpu --time-scale 0.5 --T 1024 --K 50

**The job's shape** (issue 36): ``--blocks`` splits the budget ``--T`` into blocks of
``--block-size`` (``K`` transitions each); ``--eos-median N`` gives the server's model an EOS
(``benchmarks.fast_model.EosHazard``: geometric answer lengths of median ``N`` tokens at the
proposal temperature) and the chains stop after the block whose state holds one
(``--stop-at-eos on``, the sampler's default). ``--stop-at-eos both`` also runs the arms of
``--every-block-arms`` with the stop rule off (``ARM/every``, same seeds) and reports the ratio:
every block against stopping at EOS, per traversal. ``--sampler`` takes a comma-separated list
(one table per sampler, arms interleaved per prompt across samplers). Per arm the table adds the
blocks run, the answers' lengths (median [min-max]), how many chains stopped at an EOS and the
tokens generated per chain; a replay is token for token and block for block (``bfs`` and
``predictive`` are exact in law, not token for token: their count is marked ``(in law)``).

    .venv/bin/python -m benchmarks.bench_stream --profile gpu --time-scale 0.5 --T 3072 \
        --blocks 16 --K 10 --eos-median 1024 --stop-at-eos both \
        --sampler power_mh,entropy_cut,multi_try_mh --arms sequential,crn,predictive,stream \
        --n-pf auto

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
import resource
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Coroutine, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import aiohttp

from presto_client.backends import EngineSpec, create_engine
from presto_client.core.kernels import make_kernel
from presto_client.core.runners import ChainResult, chain_budget, run_chain
from presto_client.core.sampler_config import TRAVERSALS, SamplerConfig, replaying_names
from presto_client.core.speculation import DEFAULT_TOLERANCE
from presto_client.reporting.tables import format_stream_waits

ROOT = Path(__file__).resolve().parents[1]
ALL_ARMS = ("sequential", "bfs", "predictive", "crn", "stream")
T = TypeVar("T")


@dataclass
class Arm:
    traversal: str
    n_pf: int | None
    """W / N_pf; ``None``: the method's default (``stream``: no cap, the engine sizes it)."""
    stop_at_eos: bool = True
    """The stop rule (only where the model has an EOS); ``False``: every block runs."""

    @property
    def name(self) -> str:
        base = self.traversal
        if self.traversal != "sequential":
            base = f"{self.traversal}@{'auto' if self.n_pf is None else self.n_pf}"
        return base if self.stop_at_eos else f"{base}/every"

    @property
    def stop_twin(self) -> str:
        """The name of the same arm with the stop rule on."""
        return Arm(self.traversal, self.n_pf).name


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
    sampler: str = "power_mh"
    stop_at_eos: bool = True
    client_cpu_s: float = 0.0
    """This process's CPU over the block (the latency server runs in its own)."""
    walk_cpu_s: float = 0.0
    """Of which in the chains' own tasks (:class:`CpuMeter`): the walk apart from parsing."""

    def total(self, key: str) -> float:
        """Sum of a statistic over the chains that finished (failed ones have no stats)."""
        return float(sum(c["stats"][key] for c in self.chains if "stats" in c))


class CpuMeter:
    """CPU time (this thread's) spent inside the coroutines it meters, their awaits excluded:
    a chain's own task (the walk, its policy, issuing and closing requests), not the tasks
    that receive and parse its streams."""

    def __init__(self) -> None:
        self.cpu_s = 0.0

    def run(self, coro: Coroutine[Any, Any, T]) -> Awaitable[T]:
        return _Metered(coro, self)


class _Metered(Generic[T]):
    __slots__ = ("_coro", "_meter")

    def __init__(self, coro: Coroutine[Any, Any, T], meter: CpuMeter) -> None:
        self._coro, self._meter = coro, meter

    def __await__(self) -> Generator[Any, Any, T]:
        coro, meter = self._coro, self._meter
        value: Any = None
        error: BaseException | None = None
        while True:
            start = time.thread_time()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                meter.cpu_s += time.thread_time() - start
                return cast(T, stop.value)
            except BaseException:
                meter.cpu_s += time.thread_time() - start
                raise
            meter.cpu_s += time.thread_time() - start
            try:
                value, error = (yield yielded), None
            except BaseException as exc:  # (cancellation goes in, as the task sends it)
                value, error = None, exc


class LatencyServerProcess:
    """``python -m benchmarks.latency_server`` in a subprocess (a context manager)."""

    def __init__(self, args: list[str], *, quiet: bool = False) -> None:
        self.args = args
        self.quiet = quiet
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
        if not self.quiet:
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


def sampler_config(
    name: str,
    alpha: float,
    T: int,
    K: int,
    *,
    blocks: int = 1,
    eos_token_id: int | None = None,
    stop_at_eos: bool = True,
) -> SamplerConfig:
    """``blocks`` blocks of ``T`` tokens (``T`` is the block size), ``K`` transitions each."""
    return SamplerConfig(
        sampler=name,  # type: ignore[arg-type]
        alpha=alpha,
        block_size=T,
        num_blocks=blocks,
        steps_per_block=K,
        eos_token_id=eos_token_id,
        stop_at_eos=stop_at_eos and eos_token_id is not None,
    )


def chain_record(result: ChainResult, seed: int, wall_s: float) -> dict[str, Any]:
    return {
        "seed": seed,
        "wall_s": wall_s,
        "stats": result.stats.as_dict(),
        "tokens": list(result.full_token_ids),
        "answer_tokens": len(result.token_ids),
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
    # (aiohttp, the client's own stack: the demo's install has no other.)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(base_url, timeout=timeout) as control:
        (await control.post("/stats/reset")).raise_for_status()

        async def one(c: int) -> dict[str, Any]:
            t0 = time.perf_counter()
            try:
                chain = run_chain(
                    engine,
                    prompt,
                    sampler,
                    traversal=arm.traversal,
                    size=arm.n_pf,
                    seed=seed + c,
                    budget=budget,
                )
                result = await walk.run(chain)
            except Exception as exc:  # one failed chain does not end the benchmark
                print(f"chain {arm.name} prompt {prompt_index} seed {seed + c} failed: {exc!r}")
                return {
                    "seed": seed + c,
                    "wall_s": time.perf_counter() - t0,
                    "error": repr(exc),
                    "traceback": traceback.format_exc(),
                }
            return chain_record(result, seed + c, time.perf_counter() - t0)

        walk = CpuMeter()
        t0, cpu0 = time.perf_counter(), _process_cpu_s()
        try:
            records = await asyncio.gather(*(one(c) for c in range(chains)))
        finally:
            await engine.aclose()
        wall = time.perf_counter() - t0
        cpu = _process_cpu_s() - cpu0
        async with control.get("/stats") as reply:
            server = await reply.json()
    return Block(
        arm.name,
        arm.traversal,
        arm.n_pf,
        prompt_index,
        wall,
        list(records),
        server,
        sampler.sampler,
        arm.stop_at_eos,
        client_cpu_s=cpu,
        walk_cpu_s=walk.cpu_s,
    )


def _process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _med_range(values: list[float]) -> dict[str, float]:
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _ok_pairs(b: Block, ref: Block) -> list[int]:
    """Chains that finished in both blocks (failed ones have no stats)."""
    return [
        i
        for i, (c, r) in enumerate(zip(b.chains, ref.chains, strict=True))
        if "stats" in c and "stats" in r
    ]


def _paired(chains: list[dict[str, Any]], key: str, ok: list[int]) -> float:
    return float(sum(chains[i]["stats"][key] for i in ok))


def summarise(blocks: list[Block], arms: list[Arm]) -> list[dict[str, Any]]:
    """One row per sampler and arm; speedups against ``sequential`` with the same stop rule."""
    rows = []
    samplers = list(dict.fromkeys(b.sampler for b in blocks))
    for sampler in samplers:
        base = {
            (b.prompt, b.stop_at_eos): b
            for b in blocks
            if b.traversal == "sequential" and b.sampler == sampler
        }
        for arm in arms:
            mine = [b for b in blocks if b.arm == arm.name and b.sampler == sampler]
            if mine:
                rows.append(_row(sampler, arm, mine, base))
    return rows


def _row(
    sampler: str, arm: Arm, mine: list[Block], base: dict[tuple[int, bool], Block]
) -> dict[str, Any]:
    call_sp, wall_sp, tok_rel, srv_rel, replays, failed = [], [], [], [], 0, 0
    pooled = {"ref_wall": 0.0, "wall": 0.0, "ref_calls": 0.0, "calls": 0.0}
    for b in mine:
        ref = base.get((b.prompt, b.stop_at_eos))
        if ref is None:
            continue
        ok = _ok_pairs(b, ref)
        failed += len(b.chains) - len(ok)
        if not ok:
            continue
        call_sp.append(
            _paired(ref.chains, "model_call_time_s", ok)
            / max(_paired(b.chains, "model_call_time_s", ok), 1e-9)
        )
        ref_wall = sum(ref.chains[i]["wall_s"] for i in ok)
        wall_sp.append(ref_wall / max(sum(b.chains[i]["wall_s"] for i in ok), 1e-9))
        pooled["ref_wall"] += ref_wall
        pooled["wall"] += sum(b.chains[i]["wall_s"] for i in ok)
        pooled["ref_calls"] += _paired(ref.chains, "model_call_time_s", ok)
        pooled["calls"] += _paired(b.chains, "model_call_time_s", ok)
        ref_tokens = max(_paired(ref.chains, "tokens_generated", ok), 1.0)
        tok_rel.append(_paired(b.chains, "tokens_generated", ok) / ref_tokens)
        srv_rel.append(
            b.server.get("tokens_generated", 0) / max(ref.server.get("tokens_generated", 0), 1)
        )
        # Token for token (the state's tokens: the stop block included) and block for block.
        replays += sum(
            b.chains[i]["tokens"] == ref.chains[i]["tokens"]
            and b.chains[i]["stats"].get("blocks_run") == ref.chains[i]["stats"].get("blocks_run")
            for i in ok
        )
    done = [c for b in mine for c in b.chains if "stats" in c]
    transitions = sum(b.total("transitions") for b in mine)
    calls = sum(b.total("rounds") for b in mine)
    wall = sum(b.wall_s for b in mine)
    n_chains = sum(len(b.chains) for b in mine)
    answers = [float(c.get("answer_tokens", len(c["tokens"]))) for c in done]
    return {
        "sampler": sampler,
        "arm": arm.name,
        "traversal": arm.traversal,
        "n_pf": arm.n_pf,
        "stop_at_eos": arm.stop_at_eos,
        "chains": n_chains,
        "model_call_time_s": sum(b.total("model_call_time_s") for b in mine),
        "wall_s": wall,
        "speedup_calls": _med_range(call_sp),
        "speedup_wall": _med_range(wall_sp),
        # The job's: every prompt's chains together (long answers weigh more than short ones).
        "speedup_wall_pooled": pooled["ref_wall"] / max(pooled["wall"], 1e-9),
        "speedup_calls_pooled": pooled["ref_calls"] / max(pooled["calls"], 1e-9),
        "transitions_per_call": transitions / calls if calls else 0.0,
        # The client's CPU per MH transition: all of it (transport, parsing, scoring, walk)
        # and the walk's own (the chains' tasks, parsing apart).
        "client_cpu_ms_per_transition": 1e3
        * sum(b.client_cpu_s for b in mine)
        / max(transitions, 1.0),
        "walk_cpu_ms_per_transition": 1e3 * sum(b.walk_cpu_s for b in mine) / max(transitions, 1.0),
        "client_cpu_us_per_token": 1e6
        * sum(b.client_cpu_s for b in mine)
        / max(sum(b.total("tokens_generated") for b in mine), 1.0),
        "tokens_vs_sequential": _med_range(tok_rel),
        "server_tokens_vs_sequential": _med_range(srv_rel),
        "tokens_per_chain": statistics.mean(
            [float(c["stats"]["tokens_generated"]) for c in done] or [0.0]
        ),
        "blocks_run_mean": statistics.mean(
            [float(c["stats"].get("blocks_run", 0)) for c in done] or [0.0]
        ),
        "stopped_at_eos": sum(bool(c["stats"].get("stopped_at_eos")) for c in done),
        "answer_tokens": _med_range(answers),
        "answer_tokens_mean": statistics.mean(answers or [0.0]),
        "requests_cancelled": sum(b.total("requests_cancelled") for b in mine),
        "early_rejects": sum(b.total("early_rejects") for b in mine),
        "tokens_saved_early": sum(b.total("tokens_saved_early") for b in mine),
        "budget_wait_s": sum(b.total("budget_wait_s") for b in mine),
        "rewrite_wait_s": sum(b.total("rewrite_wait_s") for b in mine),
        "floor_wait_s": sum(b.total("floor_wait_s") for b in mine),
        "budget_refusals": sum(b.total("budget_refusals") for b in mine),
        "slot_refusals": sum(b.total("slot_refusals") for b in mine),
        "replays_sequential": f"{replays}/{n_chains}",
        "replaying": arm.traversal in replaying_names(),
        "failed_chains": failed,
        "throughput_tps": transitions / wall if wall else 0.0,
        "mean_chain_latency_s": statistics.mean([c["wall_s"] for c in done] or [0.0]),
        "server_peak_running": max(b.server.get("peak_running", 0) for b in mine),
        "server_mean_running": statistics.mean(b.server.get("mean_running", 0.0) for b in mine),
        "server_aborted": sum(b.server.get("aborted", 0) for b in mine),
        "server_starved_share": max(b.server.get("starved_share", 0.0) for b in mine),
        "server_dropped_s": sum(b.server.get("dropped_s", 0.0) for b in mine),
    }


def stop_ratios(blocks: list[Block], arms: list[Arm]) -> list[dict[str, Any]]:
    """Every block against stopping at EOS, per sampler and arm run both ways (same seeds):
    the ratios of chain wall time, model-call time and tokens generated (median [min-max]
    over prompts), with the blocks each ran."""
    out = []
    for sampler in dict.fromkeys(b.sampler for b in blocks):
        for arm in arms:
            if arm.stop_at_eos:
                continue
            every = [b for b in blocks if b.sampler == sampler and b.arm == arm.name]
            stops = {b.prompt: b for b in blocks if b.sampler == sampler and b.arm == arm.stop_twin}
            wall, calls, tokens, blocks_every, blocks_stop = [], [], [], [], []
            pooled = [0.0, 0.0]
            for b in every:
                ref = stops.get(b.prompt)
                if ref is None:
                    continue
                ok = _ok_pairs(b, ref)
                if not ok:
                    continue
                wall.append(
                    sum(b.chains[i]["wall_s"] for i in ok)
                    / max(sum(ref.chains[i]["wall_s"] for i in ok), 1e-9)
                )
                pooled[0] += sum(b.chains[i]["wall_s"] for i in ok)
                pooled[1] += sum(ref.chains[i]["wall_s"] for i in ok)
                calls.append(
                    _paired(b.chains, "model_call_time_s", ok)
                    / max(_paired(ref.chains, "model_call_time_s", ok), 1e-9)
                )
                tokens.append(
                    _paired(b.chains, "tokens_generated", ok)
                    / max(_paired(ref.chains, "tokens_generated", ok), 1.0)
                )
                blocks_every += [float(b.chains[i]["stats"].get("blocks_run", 0)) for i in ok]
                blocks_stop += [float(ref.chains[i]["stats"].get("blocks_run", 0)) for i in ok]
            if wall:
                out.append(
                    {
                        "sampler": sampler,
                        "arm": arm.stop_twin,
                        "ratio_wall": _med_range(wall),
                        "ratio_wall_pooled": pooled[0] / max(pooled[1], 1e-9),
                        "prompts": len(wall),
                        "ratio_calls": _med_range(calls),
                        "ratio_tokens": _med_range(tokens),
                        "blocks_every": statistics.mean(blocks_every),
                        "blocks_stop": statistics.mean(blocks_stop),
                    }
                )
    return out


def _fmt_range(r: dict[str, float]) -> str:
    return f"{r['median']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]"


def markdown_compact(rows: list[dict[str, Any]], header: str) -> str:
    """The table a reader needs first, within 100 columns (``markdown`` has every column)."""
    lines = [
        header,
        "",
        "| arm | end to end | pooled | model calls | trans/call | tokens vs seq | replays "
        "| starved |",  # (replays "law": exact in law only, other chains of the same law)
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {_fmt_range(r['speedup_wall'])} "
            f"| {r.get('speedup_wall_pooled', float('nan')):.2f}x "
            f"| {_fmt_range(r['speedup_calls'])} | {r['transitions_per_call']:.2f} "
            f"| {r['tokens_vs_sequential']['median']:.2f}x | {r['replays_sequential']}"
            f"{'' if r.get('replaying', True) else ' law'} "
            f"| {r['server_starved_share']:.1%} |"
        )
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [
        header,
        "",
        "| arm | speedup (end to end) | pooled | speedup (model-call time) | trans/call "
        "| tokens vs seq "
        "(client/server) | tokens/chain | blocks run | answer tokens | stopped at EOS "
        "| cancelled | early rej. | tokens saved | replays seq | trans/s "
        "| mean chain s | server peak/mean running | starved | clock dropped s |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        answers = r["answer_tokens"]
        lines.append(
            f"| {r['arm']} | {_fmt_range(r['speedup_wall'])} "
            f"| {r.get('speedup_wall_pooled', float('nan')):.2f}x "
            f"| {_fmt_range(r['speedup_calls'])} "
            f"| {r['transitions_per_call']:.2f} | {r['tokens_vs_sequential']['median']:.2f}x / "
            f"{r['server_tokens_vs_sequential']['median']:.2f}x "
            f"| {r['tokens_per_chain']:.0f} | {r['blocks_run_mean']:.1f} "
            f"| {answers['median']:.0f} [{answers['min']:.0f}-{answers['max']:.0f}] "
            f"| {r['stopped_at_eos']}/{r['chains']} "
            f"| {r['requests_cancelled']:.0f} | {r['early_rejects']:.0f} "
            f"| {r['tokens_saved_early']:.0f} | {r['replays_sequential']}"
            f"{'' if r.get('replaying', True) else ' (in law)'} "
            f"| {r['throughput_tps']:.2f} | {r['mean_chain_latency_s']:.2f} "
            f"| {r['server_peak_running']}/{r['server_mean_running']:.1f} "
            f"| {r['server_starved_share']:.1%} | {r['server_dropped_s']:.1f} |"
        )
    waits = format_stream_waits(rows)
    return "\n".join(lines) + "\n" + (f"\n{waits}\n" if waits else "")


def markdown_cpu(rows: list[dict[str, Any]]) -> str:
    """The client's CPU per arm: per MH transition (all, and the walk's own) and per token."""
    lines = [
        "**The client's CPU** (this process; the latency server runs in its own)\n",
        "| sampler | arm | chains | CPU / transition | the walk's own | CPU / generated token |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "walk_cpu_ms_per_transition" not in r:  # (a run saved before these were kept)
            continue
        lines.append(
            f"| {r['sampler']} | {r['arm']} | {r['chains']} | "
            f"{r['client_cpu_ms_per_transition']:.2f} ms | "
            f"{r['walk_cpu_ms_per_transition']:.2f} ms | {r['client_cpu_us_per_token']:.1f} µs |"
        )
    return "\n".join(lines) + "\n"


def markdown_stop(ratios: list[dict[str, Any]]) -> str:
    """The stop rule's gain: every block against stopping at EOS, same arm and seeds."""
    if not ratios:
        return ""
    lines = [
        "| sampler | arm | every block / stop at EOS: end to end | pooled | model-call time "
        "| tokens | blocks run (every / stop) | prompts |",
        "|---|---|---|---:|---|---|---|---:|",
    ]
    for r in ratios:
        lines.append(
            f"| {r['sampler']} | {r['arm']} | {_fmt_range(r['ratio_wall'])} "
            f"| {r.get('ratio_wall_pooled', float('nan')):.2f}x "
            f"| {_fmt_range(r['ratio_calls'])} | {_fmt_range(r['ratio_tokens'])} "
            f"| {r['blocks_every']:.1f} / {r['blocks_stop']:.1f} | {r.get('prompts', '')} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (extra 'plots'): no plot", flush=True)
        return False
    if not any(r["n_pf"] is not None and r["traversal"] != "sequential" for r in rows):
        return False  # no sweep (W / N_pf only "auto"): nothing to plot
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


def block_size(args: argparse.Namespace) -> int:
    """The block size: ``--block-size``, else the budget ``--T`` split into ``--blocks``."""
    if args.block_size is not None:
        return int(args.block_size)
    if args.T % args.blocks:
        raise SystemExit(f"--T {args.T} does not split into {args.blocks} blocks")
    return int(args.T // args.blocks)


def budget(args: argparse.Namespace) -> int:
    """Tokens a chain may generate at most: ``blocks × block size``."""
    return int(args.blocks * block_size(args))


def eos_token_id(args: argparse.Namespace) -> int | None:
    if not args.eos_median:
        return None
    return args.vocab_size - 1 if args.eos_token_id is None else int(args.eos_token_id)


def make_arms(args: argparse.Namespace) -> list[Arm]:
    """The arms in the order they run per prompt: with the stop rule, then (``--stop-at-eos
    both``) the arms of ``--every-block-arms`` without it."""
    names = []
    for name in args.arms.split(","):
        if name not in TRAVERSALS:
            print(f"note: traversal {name!r} is not registered (TRAVERSALS={TRAVERSALS}): skipped")
            continue
        names.append(name)

    def arms_of(name: str, stop: bool) -> list[Arm]:
        if name == "sequential":
            return [Arm(name, 1, stop)]
        return [Arm(name, n, stop) for n in args.n_pf]

    modes = {"on": [True], "off": [False], "both": [True, False]}[args.stop_at_eos]
    every = set(args.every_block_arms.split(",")) if args.stop_at_eos == "both" else set(names)
    arms: list[Arm] = []
    for stop in modes:
        for name in names:
            if stop or name in every:
                arms.extend(arms_of(name, stop))
    return arms


async def bench(args: argparse.Namespace, base_url: str) -> dict[str, Any]:
    samplers = args.sampler.split(",")
    size = block_size(args)
    eos = eos_token_id(args)
    configs = {
        (name, stop): sampler_config(
            name, args.alpha, size, args.K, blocks=args.blocks, eos_token_id=eos, stop_at_eos=stop
        )
        for name in samplers
        for stop in (True, False)
    }
    prompts = make_prompts(args.prompts, args.prompt_len, args.vocab_size, args.seed)
    arms = make_arms(args)
    # An uncapped window may keep every transition of the block in flight, each proposal with
    # its sequences (MultiTryMH: one request per try).
    sizes = [n for n in args.n_pf if n is not None]
    per = max(make_kernel(c).sequences_per_proposal for c in configs.values())
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
        for name in samplers:
            for arm in arms:
                block = await run_block(
                    base_url,
                    arm,
                    p,
                    prompt,
                    configs[name, arm.stop_at_eos],
                    args.chains,
                    args.seed + 1000 * p,
                    spec_kw,
                    args.speculation_tolerance,
                )
                blocks.append(block)
                if partial is not None:  # what a killed run leaves behind
                    with partial.open("a") as fh:
                        fh.write(json.dumps(block.__dict__) + "\n")
                done = [c["stats"] for c in block.chains if "stats" in c]
                if args.quiet:
                    continue
                print(
                    f"prompt {p} {name} {arm.name:>14}: wall {block.wall_s:7.2f} s, model-call "
                    f"{block.total('model_call_time_s'):7.2f} s, transitions "
                    f"{block.total('transitions'):.0f}, calls {block.total('rounds'):.0f}, "
                    f"blocks {'/'.join(str(c.get('blocks_run')) for c in done)}, tokens "
                    f"{block.total('tokens_generated'):.0f}, server peak "
                    f"{block.server.get('peak_running')}, starved "
                    f"{block.server.get('starved_share', 0):.1%}",
                    flush=True,
                )
    rows = summarise(blocks, arms)
    return {
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "total_wall_s": time.perf_counter() - t_start,
        "rows": rows,
        "stop_ratios": stop_ratios(blocks, arms),
        "blocks": [b.__dict__ for b in blocks],
    }


def _samplers(text: str) -> str:
    names = text.split(",")
    for name in names:
        if name not in ("power_mh", "entropy_cut", "multi_try_mh"):
            raise argparse.ArgumentTypeError(f"unknown sampler {name!r}")
    return ",".join(dict.fromkeys(names))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_stream",
        description="Traversals side by side on the latency-model server (arms interleaved).",
    )
    parser.add_argument("--profile", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument(
        "--cost",
        default=None,
        metavar="A_MS,B_MS,PREFILL_US",
        help="the server's step time, measured (benchmarks.gpu_check), instead of the profile's",
    )
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
    parser.add_argument(
        "--T", type=int, default=1024, help="the budget: blocks x block size (one block: its size)"
    )
    parser.add_argument("--blocks", type=int, default=1, help="blocks the budget is split into")
    parser.add_argument(
        "--block-size", type=int, default=None, help="tokens a block (default: T / blocks)"
    )
    parser.add_argument("--K", type=int, default=50, help="MH steps a block")
    parser.add_argument("--alpha", type=float, default=4.0)
    parser.add_argument(
        "--sampler",
        type=_samplers,
        default="power_mh",
        help="power_mh, entropy_cut, multi_try_mh, or a comma-separated list of them",
    )
    parser.add_argument(
        "--eos-median",
        type=float,
        default=None,
        help="give the server's model an EOS: geometric answer lengths of this median (tokens) "
        "at the proposal temperature 1/alpha (default: none, answers never end)",
    )
    parser.add_argument(
        "--eos-token-id", type=int, default=None, help="the EOS (default: the last token)"
    )
    parser.add_argument(
        "--stop-at-eos",
        choices=("on", "off", "both"),
        default="on",
        help="the stop rule (with --eos-median): on (the default config), off (every block "
        "runs), both (the arms of --every-block-arms run also with it off: the ratio)",
    )
    parser.add_argument(
        "--every-block-arms",
        default="sequential,stream",
        help="with --stop-at-eos both: the traversals also run with the stop rule off",
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
    parser.add_argument(
        "--quiet", action="store_true", help="the tables only (no line per prompt and arm)"
    )
    parser.add_argument(
        "--wide", action="store_true", help="print every column (results.md has them anyway)"
    )
    parser.add_argument(
        "--resummarise",
        type=Path,
        default=None,
        help="no run: the tables of a saved results.json (its own options), written to --out",
    )
    return parser


def resummarise(path: Path) -> tuple[argparse.Namespace, dict[str, Any]]:
    """A saved run's options and its result, summarised again by this code."""
    saved = json.loads(path.read_text())
    args = build_parser().parse_args([])
    for key, value in saved["config"].items():
        setattr(args, key, value)
    blocks = [Block(**b) for b in saved["blocks"]]
    arms = make_arms(args)
    result = {
        **saved,
        "rows": summarise(blocks, arms),
        "stop_ratios": stop_ratios(blocks, arms),
    }
    return args, result


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.resummarise is not None:
        out = args.out
        args, result = resummarise(args.resummarise)
        args.out = out
        report(args, result)
        return
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
        str(max(4096, args.prompt_len + budget(args) + 1)),
        "--max-logprobs",
        str(args.max_logprobs),
    ]
    if args.max_num_seqs is not None:
        server_args += ["--max-num-seqs", str(args.max_num_seqs)]
    if args.cost is not None:
        server_args += ["--cost", args.cost]
    server_args += ["--model", args.model]
    eos = eos_token_id(args)
    if eos is not None:
        server_args += ["--eos-token-id", str(eos), "--eos-median", str(args.eos_median)]
        server_args += ["--eos-temperature", repr(1.0 / args.alpha)]
    if args.server_url:
        if eos is not None:
            print(f"note: --server-url: the server must serve EOS {eos} itself", flush=True)
        result = asyncio.run(bench(args, args.server_url))
    else:
        with LatencyServerProcess(server_args, quiet=args.quiet) as server:
            result = asyncio.run(bench(args, server.base_url))
    report(args, result)


def report(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Write ``results.json``, ``results.md`` and the plots under ``--out``; print the tables."""
    eos = eos_token_id(args)
    args.out.mkdir(parents=True, exist_ok=True)
    shape = (
        f"T={args.T}, K={args.K}"
        if args.blocks == 1
        else f"T={budget(args)} in {args.blocks} blocks of {block_size(args)}, K={args.K} a block"
    )
    if eos is not None:
        shape += f", EOS median {args.eos_median:g}, stop at EOS {args.stop_at_eos}"
    samplers = args.sampler.split(",")
    tables, plots, wide = [], [], []
    for name in samplers:
        title = (
            f"{args.profile} profile (time_scale {args.time_scale}), {name} alpha={args.alpha},"
            f" {shape}, {args.prompts} prompts x {args.chains} chains"
        )
        rows = [r for r in result["rows"] if r["sampler"] == name]
        tables.append(markdown_compact(rows, f"**{title}**"))
        wide.append(markdown(rows, f"**{title}** (every column)"))
        png = args.out / ("speedup.png" if len(samplers) == 1 else f"speedup_{name}.png")
        if plot(rows, png, title):
            plots.append(png)
    tables.append(markdown_cpu(result["rows"]))
    ratios = markdown_stop(result["stop_ratios"])
    if ratios:
        tables.append(f"**Every block against stopping at EOS (same arm, seeds)**\n\n{ratios}")
    table = "\n".join(tables)
    details = "\n".join(wide)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "results.md").write_text(table + "\n" + details)
    print()
    print(table)
    print(details if args.wide else f"(every column: {args.out / 'results.md'}, or --wide)")
    print(
        f"total {result['total_wall_s']:.0f} s; wrote {args.out / 'results.json'}, "
        f"{args.out / 'results.md'}" + "".join(f", {png}" for png in plots)
    )


if __name__ == "__main__":
    main()
