"""Measure a real vLLM server's step time against the batch size; fit ``a + b * sequences``.

Start the server first (``bash scripts/vllm_cpu.sh start``), then::

    .venv/bin/python -m benchmarks.calibrate_cpu --base-url http://127.0.0.1:8765

For each concurrency ``c`` in ``--concurrency`` it streams ``c`` requests at once (distinct random
prompts, fixed ``max_tokens``, ``ignore_eos``) and takes the median gap between consecutive
tokens of each stream while all ``c`` run (the decode step time at batch ``c``); the prefill cost
per token is the time to first token of an uncached long prompt minus one step. Prints the fit and
writes it as JSON (``--out``). The ``cpu`` profile of ``benchmarks.latency_server`` holds the
figures this gave on the project's machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np


async def _stream_gaps(
    client: httpx.AsyncClient, model: str, prompt: list[int], max_tokens: int
) -> tuple[float, list[float]]:
    """Time to first token and the times of every later chunk (seconds, monotonic)."""
    payload = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "ignore_eos": True,
        "stream": True,
        "seed": random.randrange(2**31),
    }
    t0 = time.perf_counter()
    times: list[float] = []
    async with client.stream("POST", "/v1/completions", json=payload) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                times.append(time.perf_counter())
    return times[0] - t0, times


async def measure(
    base_url: str, concurrency: list[int], max_tokens: int, prompt_len: int, repeats: int
) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        rng = random.Random()  # fresh prompts: a rerun must not hit the prefix cache

        def prompt(n: int) -> list[int]:
            return [rng.randrange(100, 30000) for _ in range(n)]

        await _stream_gaps(client, model, prompt(prompt_len), 8)  # warm-up
        steps: dict[int, float] = {}
        for c in concurrency:
            gaps: list[float] = []
            for _ in range(repeats):
                results = await asyncio.gather(
                    *(_stream_gaps(client, model, prompt(prompt_len), max_tokens) for _ in range(c))
                )
                # Keep the window in which all c streams were decoding.
                start = max(times[1] for _, times in results)
                end = min(times[-1] for _, times in results)
                for _, times in results:
                    inside = [t for t in times if start <= t <= end]
                    gaps.extend(np.diff(inside).tolist())
            steps[c] = statistics.median(gaps)
            print(f"batch {c:3d}: step {steps[c] * 1e3:7.2f} ms ({len(gaps)} gaps)", flush=True)
        xs = np.array(list(steps), dtype=float)
        ys = np.array(list(steps.values()))
        b, a = np.polyfit(xs, ys, 1)
        long_len = 512
        ttfts = []
        for _ in range(repeats):
            ttft, _ = await _stream_gaps(client, model, prompt(long_len), 2)
            ttfts.append(ttft)
        short_ttfts = []
        for _ in range(repeats):
            ttft, _ = await _stream_gaps(client, model, prompt(16), 2)
            short_ttfts.append(ttft)
        prefill = (statistics.median(ttfts) - statistics.median(short_ttfts)) / (long_len - 16)
    fit = {
        "step_base_s": float(a),
        "step_per_seq_s": float(b),
        "prefill_per_token_s": float(prefill),
        "steps_s": {str(k): v for k, v in steps.items()},
        "ttft_512_s": statistics.median(ttfts),
        "ttft_16_s": statistics.median(short_ttfts),
        "max_tokens": max_tokens,
        "prompt_len": prompt_len,
    }
    print(
        f"fit: a = {a * 1e3:.2f} ms, b = {b * 1e3:.2f} ms/seq, "
        f"prefill = {prefill * 1e3:.3f} ms/token",
        flush=True,
    )
    return fit


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.calibrate_cpu")
    parser.add_argument("--base-url", default="http://127.0.0.1:8765")
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    fit = asyncio.run(
        measure(
            args.base_url,
            [int(c) for c in args.concurrency.split(",")],
            args.max_tokens,
            args.prompt_len,
            args.repeats,
        )
    )
    if args.out is not None:
        args.out.write_text(json.dumps(fit, indent=2) + "\n")


if __name__ == "__main__":
    main()
