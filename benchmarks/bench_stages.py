"""Hot-loop cost of each client stage on captured responses, two libraries side by side (issue 8).

The client benchmark (``benchmarks.bench_client``) measures the whole client, which on a shared
machine varies by more than one change saves. This one captures responses from the latency
server once (``--captures`` plain responses and as many streams, vLLM dialect, T tokens, top-20),
then, for the current library and the one at ``--before-rev`` (each in its own process), times
in a hot loop (best of 7): JSON decoding, parsing the logprob block, scoring (τ = 1 and 0.25),
both from the rows' values alone (how a whole answer is read now), parsing and scoring a chunk
of 8 one-token stream events, and the retry wrapper around a successful attempt.

    .venv/bin/python -m benchmarks.bench_stages --before-rev 6cbc95d
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_client import ROOT, _extract, _start_server


def _capture(url: str, out: Path, n: int, t: int) -> None:
    import httpx
    import orjson

    from presto_client.backends.vllm import NEUTRAL_SAMPLING

    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    rng = random.Random(1)
    with httpx.Client(base_url=url, timeout=120) as client:
        for i in range(n):
            payload = {
                "model": model,
                "prompt": [rng.randrange(64) for _ in range(32)],
                "max_tokens": t,
                "temperature": rng.choice([0.25, 1.0, 2.0]),
                "seed": i + 1,
                "logprobs": 20,
                **NEUTRAL_SAMPLING,
                "stream": False,
            }
            headers = {"Content-Type": "application/json"}
            body = client.post("/v1/completions", content=orjson.dumps(payload), headers=headers)
            (out / f"plain{i}.json").write_bytes(body.content)
            payload["stream"] = True
            body = client.post("/v1/completions", content=orjson.dumps(payload), headers=headers)
            (out / f"stream{i}.sse").write_bytes(body.content)


def _best(fn: Callable[[Any], Any], args: Sequence[Any], reps: int = 7, n: int = 30) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            for a in args:
                fn(a)
        times.append((time.perf_counter() - t0) / n / len(args))
    return 1e6 * min(times)


def _stages(captures: Path, t: int) -> dict[str, Any]:
    import orjson

    from presto_client import backends
    from presto_client.backends.completions import CanonicalKeys, top_values_of_rows
    from presto_client.backends.spec import EngineSpec
    from presto_client.backends.transport import Transport
    from presto_client.backends.vllm import VllmAdapter
    from presto_client.backends.wire import loads
    from presto_client.core.engine_protocol import ProposalRequest, ScoreSpec
    from presto_client.core.scoring import scored_from_raw, scored_from_top_values

    adapter = VllmAdapter(EngineSpec("vllm", ("http://127.0.0.1:9",), top_k=20))
    spec = ScoreSpec((1.0, 0.25))
    request = ProposalRequest((1, 2), t, 0.25, 1, spec)
    datas = [p.read_bytes() for p in sorted(captures.glob("plain*.json"))]
    bodies = [loads(d) for d in datas]
    events: list[Any] = []
    for p in sorted(captures.glob("stream*.sse")):
        for line in p.read_bytes().split(b"\n"):
            if line.startswith(b"data: {"):
                event = orjson.loads(line[6:])
                if event.get("choices") and event["choices"][0].get("token_ids"):
                    events.append(event)
    batches = [events[i : i + 8] for i in range(0, len(events) - 7, 8)]
    res: dict[str, Any] = {"library": os.path.dirname(backends.__file__)}
    res["decode_us"] = _best(loads, datas)
    res["parse_us"] = _best(lambda b: adapter.parse_generate(request, b, label="x"), bodies)
    parsed = [adapter.parse_generate(request, b, label="x") for b in bodies]
    res["score_us"] = _best(lambda p: scored_from_raw(p, spec), parsed)
    # A whole answer scored from its rows' values alone (Generation.whole_scored): in place
    # of the two stages above.
    keys = CanonicalKeys()

    def values_alone(body: Any) -> Any:
        choice = adapter.stream_choice([body])
        lp = choice["logprobs"]
        values = top_values_of_rows(
            choice["token_ids"], lp["token_logprobs"], lp["top_logprobs"], 20, keys, None
        )
        return scored_from_top_values(*values, spec)

    res["whole_values_us"] = _best(values_alone, bodies)
    res["stream8_parse_us"] = _best(
        lambda b: adapter.parse_stream_events(request, b, label="x"), batches
    )
    chunks = [adapter.parse_stream_events(request, b, label="x") for b in batches]
    res["stream8_score_us"] = _best(lambda c: scored_from_raw(c, spec), chunks)

    async def wrapper() -> float:
        transport = Transport("http://127.0.0.1:9", engine_name="x")

        async def ok() -> int:
            return 1

        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(3000):
                await transport._with_retries(ok, "x")
            best = min(best, (time.perf_counter() - t0) / 3000)
        await transport.aclose()
        return 1e6 * best

    res["retry_wrapper_us"] = asyncio.run(wrapper())
    return res


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_stages", description=__doc__)
    p.add_argument("--before-rev", default="6cbc95d")
    p.add_argument("--captures", type=int, default=20)
    p.add_argument("--T", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2, help="each library this many times")
    p.add_argument("--stage-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.stage_dir:  # internal: one library's stages
        print(json.dumps(_stages(Path(args.stage_dir), args.T)), flush=True)
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench_stages_"))
    captures = tmp / "captures"
    captures.mkdir()
    server_args = argparse.Namespace(
        profile="gpu", time_scale=0.01, stream_interval=1, max_num_seqs=None
    )
    proc, url = _start_server(server_args)
    try:
        _capture(url, captures, args.captures, args.T)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    libraries = {"before": _extract(args.before_rev, tmp), "after": ROOT}
    rows = []
    for _ in range(args.rounds):
        for name, lib in libraries.items():
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(lib), str(ROOT)]))
            cmd = [sys.executable, "-m", "benchmarks.bench_stages", "--stage-dir", str(captures)]
            cmd += ["--T", str(args.T)]
            done = subprocess.run(
                cmd, cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True, check=True
            )
            row = {"impl": name, **json.loads(done.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(json.dumps(row), flush=True)
    keys = [k for k in rows[0] if k.endswith("_us")]
    print("\n| stage | " + " | ".join(r["impl"] for r in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for k in keys:
        print(f"| {k} | " + " | ".join(f"{r[k]:.1f} µs" for r in rows) + " |")


if __name__ == "__main__":
    main()
