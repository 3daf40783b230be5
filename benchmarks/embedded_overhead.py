"""Where the embedded engine's time per token goes, against a plain transformers loop.

One process, one model load, the same chat-templated prompts, proposal length, temperature and
number of proposals for every arm; each arm reports seconds per generated token:

``plain``   a plain loop: per proposal, a fresh KV cache, the prompt prefilled, then one
            ``model(...)`` call per token (``logits_to_keep=1``), ``log_softmax`` + top-20 of
            the float32 logits and a draw at ``tau`` (``torch.multinomial``); no server.
``generate`` one ``model.generate`` per proposal (sampled, fixed length, ``output_logits``),
            top-20 of each step's ``log_softmax`` afterwards: the issue's baseline.
``engine``  the embedded engine's :class:`~presto_client.embedded.batching.BatchingEngine`
            called directly (``submit(...).result()``, no HTTP), one proposal at a time.
``http``    the same proposals through the embedded HTTP server (a subprocess, as the demo
            starts it) with the presto client (``create_engine(...).generate``, top-20 raw
            logprobs, scores at tau = 1 and 1/alpha), one at a time: a sequential chain's calls.

``chain``   real sequential PowerMH chains (block ``T``, ``K = --proposals`` transitions) on
            the same server: what a presto sequential run adds on top (its own tokens count).

``engine - plain`` is the engine's batching/sampling overhead, ``http - engine`` what HTTP, JSON
and the client add. ``--profile DIR`` saves cProfiles of the ``engine`` arm (``engine.prof``)
and prints its top functions by own time.

    nice .venv/bin/python -m benchmarks.embedded_overhead --prompts 2 --T 64 --proposals 4

The machine's other load moves all arms alike only if they interleave: ``--rounds`` repeats the
three arms in turn and the table reports each arm's median round.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

PROMPTS = (
    "What is 17 times 23? Think step by step.",
    "Name three prime numbers greater than 50 and explain why they are prime.",
    "Write one sentence explaining why the sky is blue.",
    "Explain what a hash table is to a beginner.",
)
TOP_K = 20


def _chat_ids(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def plain_loop(loaded: Any, prompts: list[list[int]], T: int, tau: float, n: int) -> int:
    """The baseline: a fresh cache per proposal, one forward per token; returns tokens made."""
    import torch
    from transformers import DynamicCache

    model = loaded.model
    made = 0
    with torch.inference_mode():
        for pi, prompt in enumerate(prompts):
            for r in range(n):
                gen = torch.Generator().manual_seed(pi * 1000 + r)
                cache = DynamicCache(config=model.config)
                ids = torch.tensor([prompt], dtype=torch.long)
                for _ in range(T):
                    out = model(
                        input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1
                    )
                    logits = out.logits[0, -1].float()
                    logp = torch.log_softmax(logits, dim=-1)
                    torch.topk(logp, TOP_K)
                    probs = torch.softmax(logits / tau, dim=-1)
                    tok = int(torch.multinomial(probs, 1, generator=gen))
                    float(logp[tok])
                    ids = torch.tensor([[tok]], dtype=torch.long)
                    made += 1
    return made


def hf_generate(loaded: Any, prompts: list[list[int]], T: int, tau: float, n: int) -> int:
    """The issue's baseline: one ``model.generate`` per proposal (sampled at ``tau``, fixed
    length, per-step scores kept for the logprobs)."""
    import torch

    model = loaded.model
    made = 0
    with torch.inference_mode():
        for pi, prompt in enumerate(prompts):
            for r in range(n):
                torch.manual_seed(pi * 1000 + r)
                out = model.generate(
                    torch.tensor([prompt], dtype=torch.long),
                    attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
                    do_sample=True,
                    temperature=tau,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=T,
                    min_new_tokens=T,
                    output_logits=True,
                    return_dict_in_generate=True,
                    pad_token_id=loaded.tokenizer.eos_token_id,
                )
                for step in out.logits:
                    torch.topk(torch.log_softmax(step[0].float(), dim=-1), TOP_K)
                made += out.sequences.shape[1] - len(prompt)
    return made


def engine_direct(engine: Any, prompts: list[list[int]], T: int, tau: float, n: int) -> int:
    from presto_client.embedded.batching import SamplingParams

    made = 0
    for pi, prompt in enumerate(prompts):
        for r in range(n):
            params = SamplingParams(
                max_tokens=T,
                temperature=tau,
                seed=pi * 1000 + r,
                logprobs=TOP_K,
                ignore_eos=True,
            )
            made += len(engine.submit(prompt, params).result(600).tokens)
    return made


def http_client(url: str, prompts: list[list[int]], T: int, tau: float, n: int) -> int:
    from presto_client.backends import EngineSpec, create_engine
    from presto_client.core.engine_protocol import ProposalRequest, ScoreSpec

    async def go() -> int:
        engine = create_engine(EngineSpec("vllm", (url,), top_k=TOP_K, max_concurrency=1))
        made = 0
        try:
            for pi, prompt in enumerate(prompts):
                for r in range(n):
                    req = ProposalRequest(
                        tuple(prompt), T, tau, pi * 1000 + r, ScoreSpec((1.0, tau))
                    )
                    (out,) = await engine.generate([req])
                    made += len(out.token_ids)
        finally:
            await engine.aclose()
        return made

    return asyncio.run(go())


def sequential_chain(url: str, prompts: list[list[int]], T: int, alpha: float, n: int) -> int:
    """Real PowerMH chains (block T, K = n transitions, one call at a time) on the server."""
    from presto_client.backends import EngineSpec, create_engine
    from presto_client.core.chain_runner import ChainSetup
    from presto_client.core.sequential_runner import SequentialRunner
    from presto_client.core.settings import SamplerConfig

    async def go() -> int:
        engine = create_engine(EngineSpec("vllm", (url,), top_k=TOP_K, max_concurrency=1))
        config = SamplerConfig(alpha=alpha, block_size=T, num_blocks=1, steps_per_block=n)
        made = 0
        try:
            for pi, prompt in enumerate(prompts):
                result = await SequentialRunner(ChainSetup(engine, config, pi)).run(prompt)
                made += result.stats.tokens_generated
        finally:
            await engine.aclose()
        return made

    return asyncio.run(go())


def _child_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``; 0 when unknown)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _top(prof: cProfile.Profile, limit: int = 25) -> str:
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(limit)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--T", type=int, default=64)
    p.add_argument("--proposals", type=int, default=4, help="proposals per prompt")
    p.add_argument("--alpha", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--arms", default="plain,engine,http")
    p.add_argument("--profile", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    tau = 1.0 / args.alpha
    # Same OpenMP policy as the embedded server sets for itself, so that the arms differ only in
    # their own code (before torch loads libgomp).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from presto_client.child_servers.embedded import EmbeddedServer
    from presto_client.embedded.batching import BatchingEngine, SamplingParams
    from presto_client.embedded.model import load_model

    loaded = load_model()
    prompts = [_chat_ids(loaded.tokenizer, t) for t in PROMPTS[: args.prompts]]
    engine = BatchingEngine(loaded)
    engine.start()
    engine.submit([1, 2, 3, 4], SamplingParams(max_tokens=4, temperature=1.0, seed=0)).result(300)
    server = EmbeddedServer(None) if {"http", "chain"} & set(arms) else None
    url = server.start() if server is not None else ""
    server_pid = server.pid if server is not None else None
    times: dict[str, list[float]] = {a: [] for a in arms}
    cpus: dict[str, list[float]] = {a: [] for a in arms}
    tokens: dict[str, int] = {}
    profiles: dict[str, cProfile.Profile] = {}
    try:
        # Warm-up of every arm (first passes are slow), not measured.
        for arm in arms:
            _run(arm, loaded, engine, url, prompts[:1], 4, tau, 1)
        for _ in range(args.rounds):
            for arm in arms:
                engine.reset()
                t0, c0, s0 = time.perf_counter(), time.process_time(), _child_cpu_s(server_pid)
                made = _run(arm, loaded, engine, url, prompts, args.T, tau, args.proposals)
                times[arm].append(time.perf_counter() - t0)
                # This process's CPU (all its threads) plus, for http, the server's.
                cpu = time.process_time() - c0
                if arm in ("http", "chain"):
                    cpu += _child_cpu_s(server_pid) - s0
                cpus[arm].append(cpu)
                tokens[arm] = made
                print(f"{arm}: {times[arm][-1]:.1f} s, {made} tokens", file=sys.stderr)
        if args.profile and "engine" in arms:
            profiles["engine"] = _profile_engine(loaded, prompts, args.T, tau, args.proposals)
    finally:
        engine.stop()
        if server is not None:
            server.stop()
    base = statistics.median(times[arms[0]]) / tokens[arms[0]]
    rows = []
    print(
        f"torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}, "
        f"{args.prompts} prompts x {args.proposals} proposals x T={args.T}, tau={tau:g}"
    )
    cbase = statistics.median(cpus[arms[0]]) / tokens[arms[0]]
    print(f"| arm | tokens | wall s | wall ms/token | vs {arms[0]} | CPU ms/token | vs {arms[0]} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for arm in arms:
        per = statistics.median(times[arm]) / tokens[arm]
        cper = statistics.median(cpus[arm]) / tokens[arm]
        rows.append({"arm": arm, "tokens": tokens[arm], "wall_s": times[arm], "cpu_s": cpus[arm]})
        print(
            f"| {arm} | {tokens[arm]} | {statistics.median(times[arm]):.1f} | {1e3 * per:.1f} | "
            f"{per / base:.2f}x | {1e3 * cper:.1f} | {cper / cbase:.2f}x |"
        )
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        for arm, prof in profiles.items():
            prof.dump_stats(args.profile / f"{arm}.prof")
            print(_top(prof))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


def _profile_engine(
    loaded: Any, prompts: list[list[int]], T: int, tau: float, n: int
) -> cProfile.Profile:
    """A cProfile of the engine's worker thread (cProfile sees only its own thread) over one
    more pass of the ``engine`` arm, on a fresh engine (not timed)."""
    from presto_client.embedded.batching import BatchingEngine

    prof = cProfile.Profile()
    profiled = BatchingEngine(loaded)
    inner = profiled._run

    def run() -> None:
        prof.enable()
        try:
            inner()
        finally:
            prof.disable()

    profiled._run = run  # type: ignore[method-assign]
    profiled.start()
    try:
        engine_direct(profiled, prompts, T, tau, n)
    finally:
        profiled.stop()
    return prof


def _run(
    arm: str,
    loaded: Any,
    engine: Any,
    url: str,
    prompts: list[list[int]],
    T: int,
    tau: float,
    n: int,
) -> int:
    if arm == "plain":
        return plain_loop(loaded, prompts, T, tau, n)
    if arm == "generate":
        return hf_generate(loaded, prompts, T, tau, n)
    if arm == "engine":
        return engine_direct(engine, prompts, T, tau, n)
    if arm == "http":
        return http_client(url, prompts, T, tau, n)
    if arm == "chain":
        return sequential_chain(url, prompts, T, 1.0 / tau, n)
    raise ValueError(f"unknown arm {arm!r}")


if __name__ == "__main__":
    raise SystemExit(main())
