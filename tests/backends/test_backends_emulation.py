"""End to end over real HTTP: the adapters against the emulation servers of the reference model.

Every score is checked against the exact values of the model the server runs: ``log p0``
equal, every ``log q`` interval containing the exact value, exact scores equal.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import Any

import httpx
import numpy as np
import pytest
from backend_helpers import FIXTURES, make_engine

from presto_client.backends.http_engine import HttpEngine
from presto_client.core.engine_protocol import (
    ProposalRequest,
    ScoredTokens,
    ScoreRequest,
    ScoreSpec,
)
from presto_client.core.logprob_math import exact_scores
from presto_client.errors import (
    EngineRequestError,
    EngineUnavailableError,
    InvalidResponseError,
    ProbeError,
)
from tests.support.emulation import EmulationServer

SPEC = ScoreSpec((0.25, 0.5, 1.0), entropy=True)
PROMPT = (1, 2, 3, 4, 5)
TOL = 1e-9


def proposals(n: int = 4, length: int = 8, tau: float = 0.25) -> list[ProposalRequest]:
    return [ProposalRequest(PROMPT, length, tau, 100 + i, SPEC) for i in range(n)]


def assert_matches_reference(
    server: EmulationServer, req: ProposalRequest, out: ScoredTokens, *, same_tokens: bool
) -> None:
    ids = out.token_ids.tolist()
    assert len(ids) == req.num_tokens
    if same_tokens:
        expected, _ = server.model.sample(req.prefix, req.num_tokens, req.temperature, req.seed)
        assert ids == expected
    rows = server.model.rows(req.prefix, ids)
    logp0, logq, entropy = exact_scores(ids, rows, req.scores.temperatures)
    np.testing.assert_allclose(out.logp0, logp0, atol=TOL)
    assert (out.logq_lo <= logq + TOL).all(), (out.logq_lo, logq)
    assert (logq <= out.logq_hi + TOL).all(), (logq, out.logq_hi)
    assert out.entropy is not None
    assert (out.entropy <= entropy + TOL).all()  # top-K-with-tail estimate: a lower bound


def engine(kind: str, server: EmulationServer, **kw: Any) -> HttpEngine:
    return make_engine(kind, server.base_url, **kw)


# ---- generate


async def test_vllm_raw_one_call_intervals(vllm_raw: EmulationServer) -> None:
    eng = engine("vllm", vllm_raw)
    reqs = proposals()
    outs = await eng.generate(reqs)
    for req, out in zip(reqs, outs, strict=True):
        assert_matches_reference(vllm_raw, req, out, same_tokens=True)
        assert not out.is_exact
        np.testing.assert_array_equal(out.logq_lo[:, 2], out.logq_hi[:, 2])  # τ = 1 exact
    # One HTTP request per proposal, each with its own seed and every knob explicit.
    assert vllm_raw.stats.requests["/v1/completions"] == len(reqs)
    seeds = sorted(p["seed"] for p in vllm_raw.stats.payloads)
    assert seeds == [r.seed for r in reqs]
    payload = vllm_raw.stats.payloads[0]
    assert payload["model"] == "reference-64" and payload["top_k"] == 0
    assert payload["logprobs"] == 20 and payload["return_tokens_as_token_ids"] is True
    await eng.aclose()


async def test_vllm_processed_two_calls_exact_at_request_temperature(
    vllm_processed: EmulationServer,
) -> None:
    eng = engine("vllm", vllm_processed, logprob_mode="processed")
    reqs = proposals()
    outs = await eng.generate(reqs)
    for req, out in zip(reqs, outs, strict=True):
        assert_matches_reference(vllm_processed, req, out, same_tokens=True)
        _, logq, _ = exact_scores(
            out.token_ids, vllm_processed.model.rows(PROMPT, out.token_ids.tolist()), (0.25,)
        )
        np.testing.assert_allclose(out.logq_lo[:, 0], logq[:, 0], atol=TOL)
        np.testing.assert_array_equal(out.logq_lo[:, 0], out.logq_hi[:, 0])
        assert out.meta["scaled_outside_interval"] < 1e-9
    assert vllm_processed.stats.requests["/v1/completions"] == 2 * len(reqs)
    scoring = [p for p in vllm_processed.stats.payloads if "prompt_logprobs" in p]
    assert len(scoring) == len(reqs)
    assert all(p["temperature"] == 1.0 and p["prompt_logprobs"] == 20 for p in scoring)
    await eng.aclose()


async def test_sglang_scaled_two_calls(sglang_scaled: EmulationServer) -> None:
    eng = engine("sglang", sglang_scaled)
    reqs = proposals(3, 6, tau=0.5)
    outs = await eng.generate(reqs)
    for req, out in zip(reqs, outs, strict=True):
        assert_matches_reference(sglang_scaled, req, out, same_tokens=True)
        np.testing.assert_array_equal(out.logq_lo[:, 1], out.logq_hi[:, 1])  # τ = 0.5 exact
    scoring = [p for p in sglang_scaled.stats.payloads if "logprob_start_len" in p]
    assert [p["logprob_start_len"] for p in scoring] == [len(PROMPT) - 1] * 3
    await eng.aclose()


async def test_sglang_raw_one_call(sglang_raw: EmulationServer) -> None:
    eng = engine("sglang", sglang_raw, logprob_mode="raw")
    reqs = proposals(3, 6)
    outs = await eng.generate(reqs)
    for req, out in zip(reqs, outs, strict=True):
        assert_matches_reference(sglang_raw, req, out, same_tokens=True)
    assert sglang_raw.stats.requests["/generate"] == 3
    await eng.aclose()


async def test_sglang_without_deterministic_flag_still_scores_right() -> None:
    with EmulationServer("sglang") as server:  # sampling_seed ignored
        eng = engine("sglang", server)
        for req, out in zip(proposals(2), await eng.generate(proposals(2)), strict=True):
            assert_matches_reference(server, req, out, same_tokens=False)
        await eng.aclose()


# ---- exact scores (Engine.score)


async def _check_exact(eng: HttpEngine, server: EmulationServer) -> None:
    tokens = (7, 9, 11, 13, 2)
    (out,) = await eng.score([ScoreRequest(PROMPT, tokens, SPEC)])
    logp0, logq, _ = exact_scores(tokens, server.model.rows(PROMPT, tokens), SPEC.temperatures)
    assert out.is_exact
    np.testing.assert_allclose(out.logp0, logp0, atol=TOL)
    np.testing.assert_allclose(out.logq_lo, logq, atol=1e-9)


async def test_score_exact_in_scaled_modes(
    vllm_processed: EmulationServer, sglang_scaled: EmulationServer
) -> None:
    await _check_exact(engine("vllm", vllm_processed, logprob_mode="processed"), vllm_processed)
    await _check_exact(engine("sglang", sglang_scaled), sglang_scaled)


async def test_score_exact_in_raw_modes_with_full_vocabulary(
    vllm_unlimited: EmulationServer, sglang_raw: EmulationServer
) -> None:
    await _check_exact(engine("vllm", vllm_unlimited), vllm_unlimited)
    full = [p for p in vllm_unlimited.stats.payloads if p.get("prompt_logprobs") == -1]
    assert len(full) == 1
    await _check_exact(engine("sglang", sglang_raw, logprob_mode="raw", vocab_size=64), sglang_raw)


async def test_score_in_raw_mode_without_max_logprobs_explains_the_fix(
    vllm_raw: EmulationServer,
) -> None:
    eng = engine("vllm", vllm_raw)
    with pytest.raises(EngineRequestError) as info:
        await eng.score([ScoreRequest(PROMPT, (1, 2), SPEC)])
    text = str(info.value)
    assert "greater than max allowed: 20" in text and "--max-logprobs -1" in text
    assert "logprob_mode: processed" in text
    # Known now: the next call fails at once, without a request.
    before = vllm_raw.stats.requests["/v1/completions"]
    with pytest.raises(EngineRequestError, match="--max-logprobs -1"):
        await eng.score([ScoreRequest(PROMPT, (1, 2), SPEC)])
    assert vllm_raw.stats.requests["/v1/completions"] == before
    await eng.aclose()


async def test_sentinel_minus_inf_through_full_vocabulary_scoring() -> None:
    """Masked tokens (p = 0) come back as -9999.0 from vLLM: they are -inf, not numbers."""
    with EmulationServer("vllm", max_logprobs=-1, masked_token_ids=(60, 61, 62, 63)) as server:
        eng = engine("vllm", server)
        await _check_exact(eng, server)
        plp = [p for p in server.stats.payloads if p.get("prompt_logprobs") == -1]
        assert plp
        await eng.aclose()


# ---- probe


async def test_probe_ok_in_every_mode(
    vllm_raw: EmulationServer,
    vllm_processed: EmulationServer,
    vllm_unlimited: EmulationServer,
    sglang_scaled: EmulationServer,
    sglang_raw: EmulationServer,
) -> None:
    cases = [
        ("vllm", vllm_raw, "raw", False),
        ("vllm", vllm_processed, "processed", None),
        ("vllm", vllm_unlimited, "raw", True),
        ("sglang", sglang_scaled, "scaled", None),
        ("sglang", sglang_raw, "raw", False),
    ]
    for kind, server, mode, exact_scoring in cases:
        eng = engine(kind, server, logprob_mode=mode)
        report = await eng.probe()
        assert report.ok and report.model == "reference-64" and report.logprob_mode == mode
        assert report.seeds_honoured is True
        assert report.max_abs_logprob_diff is not None and report.max_abs_logprob_diff < 1e-9
        assert eng.capabilities.seeds_honoured is True
        if exact_scoring is not None:
            assert eng.capabilities.scoring_call is exact_scoring
            assert bool(report.details["exact_scoring"]) is exact_scoring
        await eng.aclose()


async def test_probe_detects_processed_server_configured_raw(
    vllm_processed: EmulationServer,
) -> None:
    eng = engine("vllm", vllm_processed, logprob_mode="raw")
    with pytest.raises(ProbeError) as info:
        await eng.probe()
    text = str(info.value)
    assert "server returns processed" in text and "set logprob_mode: processed" in text
    assert "--logprobs-mode raw_logprobs" in text
    await eng.aclose()


async def test_probe_names_the_engine_on_a_nan_answer(vllm_raw: EmulationServer) -> None:
    vllm_raw.faults.nan_times = 1
    eng = engine("vllm", vllm_raw)
    with pytest.raises(ProbeError) as info:
        await eng.probe()
    text = str(info.value)
    assert text.startswith(f"[{eng.name}] {vllm_raw.base_url}") and "NaN logprob" in text
    await eng.aclose()


async def test_probe_detects_raw_server_configured_processed(vllm_raw: EmulationServer) -> None:
    eng = engine("vllm", vllm_raw, logprob_mode="processed")
    with pytest.raises(ProbeError, match="--logprobs-mode processed_logprobs"):
        await eng.probe()
    await eng.aclose()


async def test_probe_detects_sglang_mode_mismatch(sglang_raw: EmulationServer) -> None:
    eng = engine("sglang", sglang_raw)  # auto = scaled, but the server returns raw logprobs
    with pytest.raises(ProbeError, match="SGLANG_RETURN_ORIGINAL_LOGPROB"):
        await eng.probe()
    await eng.aclose()


async def test_probe_warns_when_sglang_ignores_seeds(caplog: pytest.LogCaptureFixture) -> None:
    with EmulationServer("sglang") as server:
        eng = engine("sglang", server)
        with caplog.at_level(logging.WARNING, logger="presto_client.backends.http_engine"):
            report = await eng.probe()
        assert report.ok and report.seeds_honoured is False
        assert "--enable-deterministic-inference" in caplog.text
        await eng.aclose()


async def test_probe_wrong_model_and_unreachable(vllm_raw: EmulationServer) -> None:
    eng = engine("vllm", vllm_raw, model="llama-70b")
    with pytest.raises(ProbeError, match="serves reference-64, not 'llama-70b'"):
        await eng.probe()
    await eng.aclose()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    eng = make_engine("vllm", f"http://127.0.0.1:{port}")
    with pytest.raises(EngineUnavailableError) as info:
        await eng.probe()
    assert f"127.0.0.1:{port}" in str(info.value) and "vllm_cpu.sh start" in str(info.value)
    # the CPU test server's port is not the configs' 8000: the hint says where it listens
    assert "port 8765" in str(info.value) and "base_url=http://127.0.0.1:8765" in str(info.value)
    await eng.aclose()


# ---- metrics


async def test_prefix_cache_metrics(
    vllm_raw: EmulationServer, sglang_scaled: EmulationServer
) -> None:
    long_prompt = tuple(range(1, 40))
    reqs = [ProposalRequest(long_prompt, 4, 0.25, s, SPEC) for s in range(3)]
    for kind, server in (("vllm", vllm_raw), ("sglang", sglang_scaled)):
        eng = engine(kind, server)
        before = await eng.metrics()
        for r in reqs:  # one after another: the later ones hit the cached prefix
            await eng.generate([r])
        after = await eng.metrics()
        assert after["prefix_cache_queries"] > before.get("prefix_cache_queries", 0)
        assert after["prefix_cache_hits"] > 0
        assert 0 < after["prefix_cache_hit_rate"] <= 1
        await eng.aclose()


async def test_no_metrics_for_generic_openai() -> None:
    assert await make_engine("openai", "http://127.0.0.1:9").metrics() == {}


# ---- faults over real HTTP


async def test_fault_503_then_success(vllm_raw: EmulationServer) -> None:
    sleeps: list[float] = []
    vllm_raw.faults.fail_times = 2
    vllm_raw.faults.retry_after = "1"
    eng = engine("vllm", vllm_raw, sleeps=sleeps)
    (out,) = await eng.generate(proposals(1))
    assert len(out) == 8 and sleeps == [1.0, 1.0]
    assert eng.transport.retries == 2
    await eng.aclose()


async def test_fault_503_forever_is_unavailable(vllm_raw: EmulationServer) -> None:
    vllm_raw.faults.fail_times = 1000
    eng = engine("vllm", vllm_raw, max_retries=2, restart_window_s=2.0)  # 503: a restart's window
    with pytest.raises(EngineUnavailableError, match=r"HTTP 503.*after \d+ attempt"):
        await eng.generate(proposals(1))
    await eng.aclose()


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("nan_times", "NaN logprob"),
        ("drop_logprobs_times", "logprobs"),
        ("short_times", "returned 7 tokens, 8 were requested"),
    ],
)
async def test_fault_bad_answers_name_the_proposal(kind: str, fault: str, message: str) -> None:
    with EmulationServer(kind, deterministic=True) as server:
        setattr(server.faults, fault, 1)
        eng = engine(kind, server)
        with pytest.raises(InvalidResponseError) as info:
            await eng.generate(proposals(1))
        assert message in str(info.value) and "proposal 0 (seed=100" in str(info.value)
        await eng.aclose()


async def test_top_k_above_server_limit_is_a_request_error(vllm_raw: EmulationServer) -> None:
    eng = engine("vllm", vllm_raw, top_k=30)
    with pytest.raises(EngineRequestError, match="logprobs of 30, which is greater than max"):
        await eng.generate(proposals(1))
    assert vllm_raw.stats.requests["/v1/completions"] == 1  # a 4xx is not retried
    await eng.aclose()


# ---- streaming and cancellation


async def test_stream_matches_generate(vllm_raw: EmulationServer) -> None:
    eng = engine("vllm", vllm_raw)
    req = proposals(1, 6)[0]
    chunks = [c async for c in eng.stream(req)]
    # One event per token; the events of one network read come as one chunk (issue 8).
    assert sum(len(c) for c in chunks) == 6 and all(len(c) >= 1 for c in chunks)
    whole = chunks[0]
    for c in chunks[1:]:
        whole = whole.concat(c)
    (direct,) = await eng.generate([req])
    np.testing.assert_array_equal(whole.token_ids, direct.token_ids)
    np.testing.assert_allclose(whole.logq_lo, direct.logq_lo)
    assert_matches_reference(vllm_raw, req, whole, same_tokens=True)
    await eng.aclose()


async def test_closing_a_stream_aborts_the_request(vllm_raw: EmulationServer) -> None:
    vllm_raw.faults.delay_s = 0.05
    eng = engine("vllm", vllm_raw)
    req = ProposalRequest(PROMPT, 200, 0.25, 5, SPEC)
    got = 0
    stream = eng.stream(req)
    async for _ in stream:
        got += 1
        if got == 2:
            break
    await stream.aclose()
    assert await asyncio.to_thread(vllm_raw.stats.stream_ended.wait, 5.0)
    assert vllm_raw.stats.aborted_streams == 1 and vllm_raw.stats.completed_streams == 0
    await eng.aclose()


async def test_stream_in_scaled_mode_yields_one_chunk(sglang_scaled: EmulationServer) -> None:
    eng = engine("sglang", sglang_scaled)
    req = proposals(1, 5)[0]
    chunks = [c async for c in eng.stream(req)]
    assert len(chunks) == 1 and len(chunks[0]) == 5
    await eng.aclose()


async def test_cancelling_generate_aborts_requests(vllm_raw: EmulationServer) -> None:
    vllm_raw.faults.delay_s = 2.0
    eng = engine("vllm", vllm_raw)
    task = asyncio.create_task(eng.generate(proposals(3)))
    await asyncio.sleep(0.2)
    t0 = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - t0 < 1.0
    await eng.aclose()


async def test_model_discovered_once(vllm_raw: EmulationServer) -> None:
    eng = engine("vllm", vllm_raw)
    assert await eng.model() == "reference-64"
    await eng.generate(proposals(2))
    assert vllm_raw.stats.requests["/v1/models"] == 1
    await eng.aclose()


# ---- the emulation answers in the shapes a real vLLM 0.32 server gave


def _fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def _keys(d: dict[str, Any]) -> set[str]:
    return set(d)


async def test_emulation_vllm_shapes_match_real_fixtures(vllm_raw: EmulationServer) -> None:
    real = _fixture("completion_raw_logprobs.response.json")
    body = {**_fixture("completion_raw_logprobs.request.json"), "prompt": [1, 2, 3, 4, 5]}
    body["model"] = "reference-64"
    async with httpx.AsyncClient(base_url=vllm_raw.base_url) as client:
        ours = (await client.post("/v1/completions", json=body)).json()
        assert _keys(ours) == _keys(real)
        assert _keys(ours["choices"][0]) == _keys(real["choices"][0])
        assert _keys(ours["choices"][0]["logprobs"]) == _keys(real["choices"][0]["logprobs"])
        assert _keys(ours["usage"]) == _keys(real["usage"])
        top0 = ours["choices"][0]["logprobs"]["top_logprobs"][0]
        assert all(k.startswith("token_id:") for k in top0) and len(top0) in (20, 21)
        sampled = ours["choices"][0]["logprobs"]["tokens"][0]
        assert next(iter(top0)) == sampled  # the sampled token is listed first
        # prompt_logprobs: null first, bare-id keys, logprob/rank/decoded_token.
        real_p = _fixture("completion_prompt_logprobs.response.json")["choices"][0]
        ours_p = (await client.post("/v1/completions", json={**body, "prompt_logprobs": 0})).json()[
            "choices"
        ][0]
        assert ours_p["prompt_logprobs"][0] is None
        (entry,) = ours_p["prompt_logprobs"][1].values()
        (real_entry,) = real_p["prompt_logprobs"][1].values()
        assert _keys(entry) == _keys(real_entry)
        assert list(ours_p["prompt_logprobs"][1]) == ["2"]
        # The 400 above --max-logprobs, in vLLM's words and shape.
        bad = await client.post("/v1/completions", json={**body, "logprobs": 50})
        assert bad.status_code == 400
        assert bad.json() == {
            "error": {
                **_fixture("error_400_logprobs_50.response.json")["error"],
            }
        }


async def test_emulation_vllm_processed_topk_sentinels(vllm_processed: EmulationServer) -> None:
    body = {**_fixture("completion_processed_topk.request.json"), "prompt": [1, 2, 3, 4, 5]}
    body["model"] = "reference-64"
    async with httpx.AsyncClient(base_url=vllm_processed.base_url) as client:
        ours = (await client.post("/v1/completions", json=body)).json()
    tops = ours["choices"][0]["logprobs"]["top_logprobs"]
    assert ours["choices"][0]["token_ids"] is None  # not asked for, as in the real answer
    for row in tops:  # top_k=3 masks the rest: logprobs=5 shows two -9999.0 entries
        values = sorted(row.values(), reverse=True)
        assert values[3:] == [-9999.0, -9999.0]


async def test_vllm_request_errors_as_the_real_server_gives_them(
    vllm_raw: EmulationServer,
) -> None:
    eng = engine("vllm", vllm_raw, model="nope")
    with pytest.raises(EngineRequestError, match=r"HTTP 404.*`nope` does not exist"):
        await eng.generate(proposals(1))
    await eng.aclose()
    eng = engine("vllm", vllm_raw)
    too_long = ProposalRequest(tuple([1] * 1024), 4, 0.25, 1, SPEC)
    with pytest.raises(EngineRequestError, match="maximum context length is 1024"):
        await eng.generate([too_long])
    # prompt + max_tokens over the context: vLLM silently returns fewer tokens.
    cut = ProposalRequest(tuple([1] * 1020), 8, 0.25, 1, SPEC)
    with pytest.raises(InvalidResponseError, match="returned 4 tokens, 8 were requested"):
        await eng.generate([cut])
    await eng.aclose()


async def test_emulation_greedy_returns_unscaled_logprobs(vllm_processed: EmulationServer) -> None:
    body = {"prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0.0, "logprobs": 1}
    async with httpx.AsyncClient(base_url=vllm_processed.base_url) as client:
        ours = (await client.post("/v1/completions", json=body)).json()
    lps = ours["choices"][0]["logprobs"]["token_logprobs"]
    rows = vllm_processed.model.rows([1, 2, 3], [0, 0, 0])
    first = int(np.argmax(rows[0]))
    assert lps[0] == pytest.approx(float(rows[0][first]))
