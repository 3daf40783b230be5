"""Measure the embedded server: ``python -m benchmarks.embedded_bench [--url URL]``.

Without ``--url`` it starts a server (``embedded_server()``) for the measurement. Figures:

- single-sequence decode speed (tokens/s, 128 tokens, ``logprobs: 20``);
- 8 proposals of 32 tokens on one prefix (different seeds, ``logprobs: 20``): all 8 sent at once
  vs one after another;
- the prefix-cache hit rate (``/metrics``, in tokens) over a PreSTO-like pattern: rounds of 8
  proposals cut at different depths of a growing response.

The machine's other load moves these numbers; run it on an idle machine and more than once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from presto_client.embedded import SERVED_MODEL_NAME

PROMPT = (
    "You are a careful assistant. Explain, step by step, how a bicycle's gears let a rider keep "
    "a comfortable cadence on hills and on flat roads, and what a beginner should know first."
)
NEUTRAL = {
    "model": SERVED_MODEL_NAME,
    "top_p": 1,
    "top_k": 0,
    "ignore_eos": True,
    "return_token_ids": True,
    "return_tokens_as_token_ids": True,
    "skip_special_tokens": False,
}


def _complete(client: httpx.Client, prompt: list[int], n: int, seed: int, tau: float) -> list[int]:
    body = {**NEUTRAL, "prompt": prompt, "max_tokens": n, "temperature": tau, "seed": seed}
    body["logprobs"] = 20
    resp = client.post("/v1/completions", json=body)
    resp.raise_for_status()
    ids: list[int] = resp.json()["choices"][0]["token_ids"]
    return ids


def _metric(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise RuntimeError(f"{name} missing from /metrics")


def measure(base_url: str) -> dict[str, Any]:
    """Run the three measurements against ``base_url``; returns the figures."""
    out: dict[str, Any] = {}
    with httpx.Client(base_url=base_url, timeout=600) as client, ThreadPoolExecutor(16) as pool:
        chat = [{"role": "user", "content": PROMPT}]
        prompt: list[int] = client.post("/tokenize", json={"messages": chat}).json()["tokens"]
        out["prompt_tokens"] = len(prompt)
        _complete(client, prompt, 8, 0, 1.0)  # warm the prefix cache and the code paths

        t0 = time.perf_counter()
        _complete(client, prompt, 128, 1, 1.0)
        out["single_tokens_per_s"] = 128 / (time.perf_counter() - t0)

        t0 = time.perf_counter()
        for seed in range(8):
            _complete(client, prompt, 32, 100 + seed, 0.25)
        out["seq_8x32_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        list(pool.map(lambda s: _complete(client, prompt, 32, 200 + s, 0.25), range(8)))
        out["conc_8x32_s"] = time.perf_counter() - t0
        out["conc_speedup"] = out["seq_8x32_s"] / out["conc_8x32_s"]

        # PreSTO-like: a 64-token state; each round sends 8 proposals cut at spread depths,
        # then the state moves to one of them.
        q0 = _metric(client, "vllm:prefix_cache_queries_total")
        h0 = _metric(client, "vllm:prefix_cache_hits_total")
        state = _complete(client, prompt, 64, 7, 0.25)
        t0 = time.perf_counter()
        for rnd in range(4):
            cuts = [(j * 64) // 8 for j in range(8)]
            calls = [(prompt + state[:cut], 64 - cut, 1000 * rnd + j) for j, cut in enumerate(cuts)]
            results = list(pool.map(lambda c: _complete(client, c[0], c[1], c[2], 0.25), calls))
            j = rnd % 8
            state = state[: cuts[j]] + results[j]
        out["presto_like_4_rounds_s"] = time.perf_counter() - t0
        queries = _metric(client, "vllm:prefix_cache_queries_total") - q0
        hits = _metric(client, "vllm:prefix_cache_hits_total") - h0
        out["prefix_cache_hit_rate"] = hits / queries if queries else 0.0
    return out


@contextlib.contextmanager
def _server(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    from presto_client.child_servers.embedded import embedded_server

    with embedded_server() as started:
        yield started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.embedded_bench")
    p.add_argument("--url", help="an embedded server already running (default: start one)")
    p.add_argument("--repeat", type=int, default=1, help="repeat the measurements")
    args = p.parse_args(argv)
    with _server(args.url) as url:
        for _ in range(args.repeat):
            print(json.dumps({k: round(v, 3) for k, v in measure(url).items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
