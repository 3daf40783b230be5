"""The project's vLLM adapter, unchanged, against the embedded server (raw logprobs mode)."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from presto_client.backends import EngineSpec, create_engine
from presto_client.backends.http_engine import HttpEngine
from presto_client.core.engine_protocol import ProposalRequest, ScoreSpec
from presto_client.embedded import SERVED_MODEL_NAME

pytestmark = pytest.mark.embedded

TAU = 0.25
FP32_TOL = 1e-3


def make_engine(base_url: str) -> HttpEngine:
    spec = EngineSpec(
        "vllm",
        (base_url,),
        model=SERVED_MODEL_NAME,
        logprob_mode="raw",
        request_timeout_s=300.0,
        max_concurrency=16,
    )
    return create_engine(spec)


def tokens(client: httpx.Client, text: str) -> tuple[int, ...]:
    return tuple(client.post("/tokenize", json={"prompt": text}).json()["tokens"])


async def test_probe(base_url: str) -> None:
    eng = make_engine(base_url)
    try:
        report = await eng.probe()
        assert report.ok and report.model == SERVED_MODEL_NAME
        assert report.seeds_honoured is True
        assert report.max_abs_logprob_diff is not None
        assert report.max_abs_logprob_diff < FP32_TOL
    finally:
        await eng.aclose()


async def test_concurrent_proposals_replay_and_agree_with_scoring(
    base_url: str, client: httpx.Client
) -> None:
    prompt = tokens(client, "The best way to learn a language is")
    spec = ScoreSpec((TAU, 1.0))
    reqs = [ProposalRequest(prompt, 12, TAU, 100 + j, spec) for j in range(8)]
    eng = make_engine(base_url)
    try:
        together = await eng.generate(reqs)
        alone = await eng.generate(reqs[3:4])
    finally:
        await eng.aclose()
    np.testing.assert_array_equal(alone[0].token_ids, together[3].token_ids)
    np.testing.assert_allclose(alone[0].logp0, together[3].logp0, atol=1e-4)
    assert len({tuple(o.token_ids.tolist()) for o in together}) > 1
    for req, out in zip(reqs[:3], together[:3], strict=True):
        assert len(out.token_ids) == 12
        assert (out.logq_lo <= out.logq_hi + 1e-12).all()
        body = {
            "prompt": [*req.prefix, *out.token_ids.tolist()],
            "max_tokens": 1,
            "temperature": 1.0,
            "prompt_logprobs": 0,
        }
        async with httpx.AsyncClient(base_url=base_url, timeout=300) as aclient:
            resp = await aclient.post("/v1/completions", json=body)
        plp = resp.json()["choices"][0]["prompt_logprobs"]
        server = [
            e[str(t)]["logprob"] for e, t in zip(plp[len(prompt) :], out.token_ids, strict=True)
        ]
        np.testing.assert_allclose(out.logp0, server, atol=FP32_TOL)


async def test_stream_abort_and_metrics(base_url: str, client: httpx.Client) -> None:
    prompt = tokens(client, "In 1492, Columbus")
    req = ProposalRequest(prompt, 8, TAU, 5, ScoreSpec((TAU,)))
    eng = make_engine(base_url)
    try:
        before = await eng.metrics()
        chunks = [c async for c in eng.stream(req)]
        whole = chunks[0]
        for c in chunks[1:]:
            whole = whole.concat(c)
        (direct,) = await eng.generate([req])
        np.testing.assert_array_equal(whole.token_ids, direct.token_ids)
        long = ProposalRequest(prompt, 400, TAU, 6, ScoreSpec((TAU,)))
        t0 = time.perf_counter()
        stream = eng.stream(long)
        got = 0
        async for _ in stream:
            got += 1
            if got == 3:
                break
        await stream.aclose()
        (after_abort,) = await eng.generate([req])
        assert len(after_abort) == 8 and time.perf_counter() - t0 < 30.0
        after = await eng.metrics()
        assert after["prefix_cache_queries"] - before["prefix_cache_queries"] >= 4 * len(prompt)
        assert after["prefix_cache_hits"] > before["prefix_cache_hits"]
    finally:
        await eng.aclose()
