"""Baseline arms without MH (issue 11): their laws on the reference model.

``sample`` draws from ``p0``; ``low_temperature`` from ``p0^(1/τ)`` normalised per position
(τ = 1/α); ``greedy`` is the argmax path. Closed forms by enumeration of every response.
"""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

from presto_client.core.baseline_runners import baseline_temperature
from presto_client.core.logprob_math import log_softmax
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.runners import run_chain
from presto_client.core.sampler_config import SamplerConfig

VOCAB = 3
PROMPT = (1, 2)
SAMPLER = SamplerConfig(alpha=4.0, block_size=1, num_blocks=2, steps_per_block=3)


def exact_law(model: ReferenceModel, temperature: float) -> dict[tuple[int, ...], float]:
    law = {}
    for seq in itertools.product(range(VOCAB), repeat=SAMPLER.response_length):
        logp, context = 0.0, list(PROMPT)
        for tok in seq:
            logp += float(log_softmax(model.logprobs(context) / temperature)[0][tok])
            context.append(tok)
        law[seq] = float(np.exp(logp))
    return law


async def draw(traversal: str, n: int) -> list[tuple[int, ...]]:
    engine = ReferenceEngine(ReferenceModel(VOCAB))
    out = []
    for seed in range(n):
        result = await run_chain(engine, PROMPT, SAMPLER, traversal=traversal, seed=seed)
        out.append(result.token_ids)
    return out


@pytest.mark.parametrize(("traversal", "temperature"), [("sample", 1.0), ("low_temperature", 0.25)])
async def test_plain_and_low_temperature_laws(traversal: str, temperature: float) -> None:
    assert baseline_temperature(traversal, SAMPLER) == temperature
    law = exact_law(ReferenceModel(VOCAB), temperature)
    assert sum(law.values()) == pytest.approx(1.0)
    n = 3000
    counts = {seq: 0 for seq in law}
    for seq in await draw(traversal, n):
        counts[seq] += 1
    # Pearson chi-square over the cells with expected count >= 5 (others pooled)
    big = [s for s in law if law[s] * n >= 5]
    small_p = sum(law[s] for s in law if s not in big)
    observed = [counts[s] for s in big]
    expected = [law[s] * n for s in big]
    if small_p * n >= 5:
        observed.append(sum(counts[s] for s in law if s not in big))
        expected.append(small_p * n)
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    scipy_stats = pytest.importorskip("scipy.stats")
    p_value = float(scipy_stats.chi2.sf(chi2, len(observed) - 1))
    assert p_value > 1e-4, (chi2, observed, expected)


async def test_low_temperature_is_not_the_power_distribution() -> None:
    """τ = 1/α sharpens per position; π_α ∝ p0^α over whole responses differs (the reason power
    sampling exists): a sanity check that the closed forms we test against are distinct."""
    model = ReferenceModel(VOCAB)
    low = exact_law(model, 0.25)
    p0 = exact_law(model, 1.0)
    z = sum(p**4 for p in p0.values())
    power = {s: p**4 / z for s, p in p0.items()}
    assert max(abs(low[s] - power[s]) for s in low) > 1e-3


async def test_greedy_is_the_argmax_path_for_every_seed() -> None:
    model = ReferenceModel(VOCAB)
    context, want = list(PROMPT), []
    for _ in range(SAMPLER.response_length):
        tok = int(np.argmax(model.logprobs(context)))
        want.append(tok)
        context.append(tok)
    assert set(await draw("greedy", 20)) == {tuple(want)}


async def test_baseline_chain_costs_one_call_without_an_eos() -> None:
    engine = ReferenceEngine(ReferenceModel(VOCAB))
    sampler = SamplerConfig(alpha=4.0, block_size=4, num_blocks=2, stop_at_eos=False)
    result = await run_chain(engine, PROMPT, sampler, traversal="sample", seed=3)
    stats = result.stats
    assert (stats.rounds, stats.extend_calls, stats.transitions) == (1, 0, 0)
    assert stats.tokens_generated == len(result.full_token_ids) == 8 and stats.blocks_run == 2


async def test_baseline_chain_stops_after_the_block_that_holds_an_eos() -> None:
    """The tokens counted are the work done (issue 50: one call of the whole budget counted
    the budget), block by block as the MH chains stop."""
    engine = ReferenceEngine(ReferenceModel(VOCAB))
    sampler = SamplerConfig(alpha=4.0, block_size=4, num_blocks=2, eos_token_id=0)
    stopped_early = 0
    for seed in range(30):
        result = await run_chain(engine, PROMPT, sampler, traversal="sample", seed=seed)
        stats = result.stats
        full = result.full_token_ids
        assert stats.tokens_generated == len(full) == 4 * stats.blocks_run
        assert stats.rounds == stats.requests_issued == stats.blocks_run
        if 0 in full[:4]:  # an EOS in the first block: the second is never asked for
            assert stats.blocks_run == 1 and stats.stopped_at_eos
            stopped_early += 1
        else:
            assert stats.blocks_run == 2
        if 0 in full:
            assert result.token_ids == full[: full.index(0) + 1]
        else:
            assert result.token_ids == full
    assert stopped_early > 0
    # the same seed replays the same sample
    a = await run_chain(engine, PROMPT, sampler, traversal="sample", seed=5)
    b = await run_chain(engine, PROMPT, sampler, traversal="sample", seed=5)
    assert a.token_ids == b.token_ids


def test_unknown_baseline() -> None:
    with pytest.raises(ValueError, match="baseline"):
        baseline_temperature("nope", SAMPLER)
    with pytest.raises(ValueError, match="unknown traversal"):
        asyncio.run(
            run_chain(ReferenceEngine(ReferenceModel(VOCAB)), PROMPT, SAMPLER, traversal="nope")
        )
