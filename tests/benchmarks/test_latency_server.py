"""The latency-model server: its step clock, its queue, aborts, and content = the emulation's."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from benchmarks.latency_server import CostProfile, LatencyServer, ServerThread
from presto_client.backends import EngineSpec, create_engine
from presto_client.core.engine_protocol import ProposalRequest, ScoreSpec
from tests.support.emulation import EmulationServer

# 10 ms per step, nearly flat in the batch (the gpu profile's shape), no prefill cost. Steps of
# several ms keep the timing assertions robust on a loaded machine (scheduling jitter of a few ms
# per request is small against them).
FLAT = CostProfile("test-flat", 10e-3, 0.1e-3, 0.0, 2)


@pytest.fixture
def flat() -> Iterator[ServerThread]:
    with ServerThread(LatencyServer(FLAT)) as server:
        yield server


def _body(prompt: list[int], n: int, seed: int, **kw: Any) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0.5,
        "seed": seed,
        "logprobs": 5,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        **kw,
    }


async def _timed(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    response = await client.post("/v1/completions", json=body)
    response.raise_for_status()
    return time.perf_counter() - t0, response.json()


async def test_two_sequences_cost_about_one_step_and_a_third_waits(flat: ServerThread) -> None:
    n = 40  # 40 steps of ~10 ms
    async with httpx.AsyncClient(base_url=flat.base_url, timeout=30) as client:
        one, _ = await _timed(client, _body([1, 2, 3], n, 0))
        two = await asyncio.gather(*(_timed(client, _body([4, i], n, i)) for i in range(2)))
        await client.post("/stats/reset")
        three = await asyncio.gather(*(_timed(client, _body([5, i], n, i)) for i in range(3)))
        stats = (await client.get("/stats")).json()
    assert one >= n * FLAT.step_base_s
    assert max(t for t, _ in two) < 1.6 * one  # batching is (nearly) free on this profile
    times = sorted(t for t, _ in three)
    # max_num_seqs = 2: the third waited n steps for a slot, then ran n (the clock is never early).
    assert times[2] > 0.95 * 2 * n * FLAT.step_base_s
    assert stats["peak_running"] == 2 and stats["peak_waiting"] >= 1
    assert stats["completed"] == 3 and stats["tokens_generated"] == 3 * n
    assert stats["aborted"] == 0


async def test_step_time_grows_with_batch_on_a_compute_bound_profile() -> None:
    steep = CostProfile("test-steep", 10e-3, 20e-3, 0.0, 8)
    with ServerThread(LatencyServer(steep)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            one, _ = await _timed(client, _body([1], 20, 0))
            four = await asyncio.gather(*(_timed(client, _body([2, i], 20, i)) for i in range(4)))
    # 20 steps of 30 ms alone vs 20 steps of 90 ms in a batch of 4 (3x; asserted > 2.2x).
    assert max(t for t, _ in four) > 2.2 * one


async def test_closed_stream_aborts_and_frees_its_slot() -> None:
    single = CostProfile("test-single", 2e-3, 0.0, 0.0, 1)
    with ServerThread(LatencyServer(single)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            body = _body([7, 8], 2000, 1, stream=True)  # ~4 s if left to finish
            async with client.stream("POST", "/v1/completions", json=body) as response:
                seen = 0
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        seen += 1
                    if seen == 3:
                        break
            t0 = time.perf_counter()
            elapsed, answer = await _timed(client, _body([9], 20, 2))
            stats = (await client.get("/stats")).json()
    assert elapsed < 0.5, "the aborted request still held the only slot"
    assert len(answer["choices"][0]["token_ids"]) == 20
    assert stats["aborted"] == 1 and stats["completed"] == 1
    assert stats["tokens_generated"] < 200
    assert time.perf_counter() - t0 < 1.0


def _stream_tokens(text: str) -> tuple[list[int], list[float], list[dict[str, float]], int]:
    ids: list[int] = []
    lps: list[float] = []
    tops: list[dict[str, float]] = []
    events = 0
    for line in text.splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        choice = event["choices"][0]
        events += 1
        ids.extend(choice["token_ids"])
        lps.extend(choice["logprobs"]["token_logprobs"])
        tops.extend(choice["logprobs"]["top_logprobs"])
    return ids, lps, tops, events


async def test_content_equals_the_emulation_server() -> None:
    emulation = EmulationServer("vllm", max_model_len=4096)
    fast = CostProfile("test-fast", 0.2e-3, 0.0, 0.0, 8)
    with ServerThread(LatencyServer(fast, stream_interval=4)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            for seed, prompt in ((0, [1, 2, 3]), (11, [5] * 40), (12, [63, 0, 7])):
                body = _body(prompt, 33, seed, logprobs=20)
                expected = emulation.vllm_completion(body)["choices"][0]
                answer = (await client.post("/v1/completions", json=body)).json()
                got = answer["choices"][0]
                assert got["token_ids"] == expected["token_ids"]
                assert got["logprobs"] == expected["logprobs"]
                assert got["text"] == expected["text"]
                streamed = await client.post("/v1/completions", json={**body, "stream": True})
                ids, lps, tops, events = _stream_tokens(streamed.text)
                assert ids == expected["token_ids"]
                assert lps == expected["logprobs"]["token_logprobs"]
                assert tops == expected["logprobs"]["top_logprobs"]
                assert events == 1 + 8  # first token alone, then 4 per event (32 = 8 * 4)
            scoring = _body([1, 2, 3, 4, 5], 1, 3, prompt_logprobs=5)
            got = (await client.post("/v1/completions", json=scoring)).json()["choices"][0]
            assert (
                got["prompt_logprobs"]
                == emulation.vllm_completion(scoring)["choices"][0]["prompt_logprobs"]
            )
            bad = await client.post("/v1/completions", json=_body([1], 4, 0, logprobs=21))
            assert bad.status_code == 400
            metrics = (await client.get("/metrics")).text
    assert "vllm:num_requests_waiting" in metrics
    assert "vllm:prefix_cache_hits_total" in metrics


async def test_the_project_client_gets_the_emulation_scores() -> None:
    emulation = EmulationServer("vllm", max_model_len=4096)
    fast = CostProfile("test-fast", 0.2e-3, 0.0, 0.0, 8)
    request = ProposalRequest((1, 2, 3, 4), 24, 0.25, 5, ScoreSpec((0.25,)))
    with (
        emulation,
        ServerThread(LatencyServer(fast, stream_interval=3)) as server,
    ):
        results = []
        for url in (emulation.base_url, server.base_url):
            engine = create_engine(EngineSpec("vllm", (url,)))
            try:
                (whole,) = await engine.generate([request])
                parts = [chunk async for chunk in engine.stream(request)]
            finally:
                await engine.aclose()
            results.append((whole, parts))
    (ref, _), (whole, parts) = results
    assert np.array_equal(whole.token_ids, ref.token_ids)
    assert np.array_equal(whole.logp0, ref.logp0)
    assert np.array_equal(whole.logq_lo, ref.logq_lo)
    assert np.concatenate([p.token_ids for p in parts]).tolist() == ref.token_ids.tolist()


def test_spawn_serves_health_and_names_a_child_that_exits() -> None:
    from pathlib import Path

    from benchmarks import latency_server

    root = Path(__file__).resolve().parents[2]
    proc, url = latency_server.spawn(["--profile", "gpu", "--time-scale", "0.1"], cwd=root)
    try:
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(SystemExit, match="exited with 2"):
        latency_server.spawn(["--no-such-option"], cwd=root, timeout_s=30)
