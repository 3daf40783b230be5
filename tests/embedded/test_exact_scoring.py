"""The embedded engine gives exact scoring (issue 10, item 12): it computes the whole
distribution anyway, so ``prompt_logprobs: -1`` (the full vocabulary) is served, the probe finds
exact scoring available and warns of nothing vLLM-specific."""

from __future__ import annotations

import httpx

from presto_client.backends import EngineSpec, create_engine


async def test_the_probe_finds_exact_scoring(base_url: str) -> None:
    engine = create_engine(EngineSpec("vllm", (base_url,), name="embedded"))
    try:
        report = await engine.probe()
    finally:
        await engine.aclose()
    assert report.details["exact_scoring"] == 1.0
    assert not any("exact scoring" in w for w in report.warnings), report.warnings


def test_full_vocabulary_prompt_logprobs(client: httpx.Client) -> None:
    body = {"model": "smollm2-135m", "prompt": [1, 2, 3, 4], "max_tokens": 1}
    resp = client.post("/v1/completions", json={**body, "prompt_logprobs": -1})
    assert resp.status_code == 200, resp.text
    rows = resp.json()["choices"][0]["prompt_logprobs"]
    assert rows[0] is None and len(rows[1]) == 49152
    # a positive K over the limit is still refused, as vLLM does
    over = client.post("/v1/completions", json={**body, "prompt_logprobs": 21})
    assert over.status_code == 400
