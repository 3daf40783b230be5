"""The latency server's EOS option: its hazard holds exactly, so answer lengths are geometric."""

from __future__ import annotations

import math

import httpx
import numpy as np
import pytest

from benchmarks.fast_model import (
    EosHazard,
    EosReferenceModel,
    WindowedReferenceModel,
    make_model,
)
from benchmarks.latency_server import (
    CostProfile,
    LatencyServer,
    ServerThread,
    build_parser,
    eos_from_args,
)
from presto_client.core.logprob_math import log_softmax
from presto_client.core.reference import ReferenceModel
from tests.support.emulation import MaskedReferenceModel

FAST = CostProfile("test-fast", 0.2e-3, 0.0, 0.0, 64)
VOCAB = 64
EOS = VOCAB - 1


def _q(row: np.ndarray, temperature: float) -> np.ndarray:
    return np.exp(log_softmax(row / temperature)[0])


@pytest.mark.parametrize("kind", ["reference", "windowed"])
def test_the_eos_has_its_hazard_at_the_temperature_in_every_row(kind: str) -> None:
    eos = EosHazard(EOS, 0.01, temperature=0.25)
    model = make_model(kind, VOCAB, seed=3, eos=eos)
    assert model is not None
    plain = ReferenceModel(VOCAB, seed=3) if kind == "reference" else None
    rng = np.random.default_rng(0)
    for n in range(1, 40):
        context = [int(t) for t in rng.integers(0, VOCAB, size=n)]
        row = model.logprobs(context)
        assert np.isclose(np.exp(row).sum(), 1.0)
        assert _q(row, 0.25)[EOS] == pytest.approx(0.01, rel=1e-9)
        assert np.array_equal(row, model.logprobs(context))  # deterministic (and cached)
        # The other tokens keep their relative probabilities.
        if plain is not None:
            base = plain.logprobs(context)
            keep = np.arange(VOCAB) != EOS
            diff = row[keep] - base[keep]
            assert np.allclose(diff, diff[0])


def test_the_option_is_off_by_default_and_leaves_the_models_as_they_were() -> None:
    assert make_model("reference", VOCAB, seed=1) is None  # the emulation's own model
    server = LatencyServer(FAST)
    assert type(server.emulation.model) is MaskedReferenceModel and server.eos is None
    a = WindowedReferenceModel(VOCAB, seed=1)
    b = WindowedReferenceModel(VOCAB, seed=1, eos=EosHazard(EOS, 0.5))
    ctx = [1, 2, 3]
    assert not np.array_equal(a.logprobs(ctx), b.logprobs(ctx))
    assert np.array_equal(a.logprobs(ctx), WindowedReferenceModel(VOCAB, seed=1).logprobs(ctx))
    with pytest.raises(ValueError):
        EosReferenceModel(VOCAB, EosHazard(VOCAB, 0.1))
    with pytest.raises(ValueError):
        EosHazard(EOS, 0.0)


def test_the_median_and_the_share_that_runs_to_the_end() -> None:
    # The issue-36 job: median a third of a 3072-token budget, 1/8 of answers run past it.
    eos = EosHazard.from_median(EOS, 1024)
    assert eos.median() == pytest.approx(1024)
    assert eos.survival(1024) == pytest.approx(0.5)
    assert eos.survival(3072) == pytest.approx(0.125)
    assert eos.survival(192) == pytest.approx(0.5 ** (192 / 1024))
    args = build_parser().parse_args(["--eos-token-id", "63", "--eos-median", "1024"])
    assert eos_from_args(args) == eos
    assert eos_from_args(build_parser().parse_args([])) is None
    with pytest.raises(SystemExit):
        eos_from_args(build_parser().parse_args(["--eos-token-id", "63"]))


@pytest.mark.parametrize("kind", ["reference", "windowed"])
def test_sampled_answer_lengths_are_geometric_at_the_proposal_temperature(kind: str) -> None:
    """The first EOS's position among answers sampled at τ: ``P(L > n) = (1 − h)^n``."""
    median, budget, answers = 40, 120, 600
    eos = EosHazard.from_median(EOS, median, temperature=0.25)
    model = make_model(kind, VOCAB, seed=7, eos=eos)
    assert model is not None
    lengths = []
    for seed in range(answers):
        length = budget + 1  # ran to the end of the budget
        prompt = [seed % VOCAB, 5]
        for i, (token, _) in enumerate(model.iter_sample(prompt, budget, 0.25, seed)):
            if token == EOS:
                length = i + 1
                break
        lengths.append(length)
    got = np.asarray(lengths)
    for n in (10, 20, 40, 80, budget):
        p = eos.survival(n)
        share = float((got > n).mean())
        sd = math.sqrt(p * (1 - p) / answers)
        assert abs(share - p) < 4.5 * sd, (n, share, p)
    assert abs(float(np.median(got)) - median) <= 8
    # Under p0 itself (temperature 1) the EOS is far more likely: the hazard is τ's alone.
    row = model.logprobs([1, 2])
    assert math.exp(row[EOS]) > eos.hazard


async def test_the_server_serves_the_eos_model() -> None:
    eos = EosHazard.from_median(EOS, 16)
    for kind in ("reference", "windowed"):
        server = LatencyServer(FAST, model=kind, eos=eos)
        with ServerThread(server) as thread:
            body = {
                "prompt": [1, 2, 3],
                "max_tokens": 64,
                "temperature": 0.25,
                "seed": 11,
                "return_token_ids": True,
            }
            async with httpx.AsyncClient(base_url=thread.base_url, timeout=30) as client:
                answer = (await client.post("/v1/completions", json=body)).json()
                stats = (await client.get("/stats")).json()
        ids = answer["choices"][0]["token_ids"]
        model = make_model(kind, VOCAB, eos=eos)
        assert model is not None
        assert ids == model.sample([1, 2, 3], 64, 0.25, 11)[0]
        assert len(ids) == 64  # the server ignores EOS: fixed-length answers
        assert stats["eos"] == {"token_id": EOS, "hazard": eos.hazard, "temperature": 0.25}


@pytest.mark.parametrize("eos", [None, EosHazard(EOS, 0.05)])
def test_the_windowed_models_cached_sampling_draws_the_reference_samplers_tokens(
    eos: EosHazard | None,
) -> None:
    model = WindowedReferenceModel(VOCAB, seed=2, eos=eos)
    for temperature in (0.25, 0.5, 1.0, 0.0):
        for seed in range(5):
            fast = list(model.iter_sample([3, seed], 200, temperature, seed))
            slow = list(ReferenceModel.iter_sample(model, [3, seed], 200, temperature, seed))
            assert [t for t, _ in fast] == [t for t, _ in slow]
            assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(fast, slow, strict=True))


async def test_the_servers_rendering_memo_serves_what_the_emulation_renders() -> None:
    """The windowed model's rendered logprobs are memoised: served twice, equal to the
    emulation's own rendering of the same tokens."""
    server = LatencyServer(FAST, model="windowed", eos=EosHazard.from_median(EOS, 16))
    body = {
        "prompt": [4, 5],
        "max_tokens": 48,
        "temperature": 0.5,
        "seed": 3,
        "logprobs": 5,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    with ServerThread(server) as thread:
        async with httpx.AsyncClient(base_url=thread.base_url, timeout=30) as client:
            first = (await client.post("/v1/completions", json=body)).json()
            second = (await client.post("/v1/completions", json=body)).json()
    assert server._entries  # the memo was used
    assert first["choices"][0]["logprobs"] == second["choices"][0]["logprobs"]
    emu = server.emulation
    opts = emu.vllm_validate(body)[1]
    ids = first["choices"][0]["token_ids"]
    rows = emu.model.rows([4, 5], ids)
    expected = [emu.vllm_token_entry(t, r, opts) for t, r in zip(ids, rows, strict=True)]
    assert first["choices"][0]["logprobs"]["top_logprobs"] == [e[1] for e in expected if e]
