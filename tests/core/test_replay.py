"""Replay: with the same seed, the sequential sampler and PreSTO-``crn`` make the same chain.

This is the sharpest exactness check there is: token for token and decision for decision, for
all three samplers, over several blocks, with exact scores and with certified top-K intervals.
"""

from __future__ import annotations

import pytest

from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.runners import ChainResult, run_chain
from presto_client.core.sampler_config import SamplerConfig

SAMPLERS = ("power_mh", "entropy_cut", "multi_try_mh")


def _decisions(result: ChainResult) -> list[tuple[int, int, int, bool, int]]:
    return [(t.block, t.k, t.cut, t.accepted, t.selected) for t in result.transitions]


@pytest.mark.parametrize("top_k", [None, 5], ids=["exact", "top5-certified"])
@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_crn_replays_the_sequential_chain(sampler: str, top_k: int | None, seed: int) -> None:
    model = ReferenceModel(12, seed=7)
    config = SamplerConfig(sampler=sampler, block_size=8, num_blocks=2, steps_per_block=24)
    sequential_engine = ReferenceEngine(model, top_k=top_k)
    presto_engine = ReferenceEngine(model, top_k=top_k)
    baseline = await run_chain(sequential_engine, [3, 1], config, traversal="sequential", seed=seed)
    presto = await run_chain(presto_engine, [3, 1], config, traversal="crn", size=8, seed=seed)

    assert presto.full_token_ids == baseline.full_token_ids
    assert _decisions(presto) == _decisions(baseline)
    assert presto.stats.accepts == baseline.stats.accepts
    assert presto.stats.transitions == baseline.stats.transitions == 48
    assert baseline.stats.rounds == 48
    assert presto.stats.rounds < baseline.stats.rounds / 2


async def test_certified_intervals_give_the_exact_chain() -> None:
    """Top-K intervals (with tightening when ambiguous) decide exactly as full scores do."""
    model = ReferenceModel(12, seed=3)
    config = SamplerConfig(sampler="multi_try_mh", block_size=8, num_blocks=1, steps_per_block=40)
    exact = await run_chain(ReferenceEngine(model), [1], config, traversal="crn", seed=4)
    engine = ReferenceEngine(model, top_k=3)
    certified = await run_chain(engine, [1], config, traversal="crn", seed=4)
    assert certified.full_token_ids == exact.full_token_ids
    assert _decisions(certified) == _decisions(exact)
    # With top-3 of 12 tokens some decisions are ambiguous and must have been tightened.
    assert certified.stats.ambiguous > 0
    assert engine.score_calls == certified.stats.tighten_calls == certified.stats.ambiguous
    assert sum(t.tightened for t in certified.transitions) == certified.stats.ambiguous


async def test_crn_with_one_prefetch_is_the_sequential_call_pattern() -> None:
    model = ReferenceModel(5, seed=1)
    config = SamplerConfig(block_size=6, steps_per_block=10)
    result = await run_chain(ReferenceEngine(model), [0], config, traversal="crn", size=1, seed=9)
    assert result.stats.rounds == 10
    assert result.stats.requests_issued == result.stats.requests_used == 10


@pytest.mark.parametrize("traversal", ["bfs", "predictive"])
@pytest.mark.parametrize("sampler", SAMPLERS)
async def test_trees_complete_every_transition_in_fewer_calls(sampler: str, traversal: str) -> None:
    model = ReferenceModel(12, seed=7)
    config = SamplerConfig(sampler=sampler, block_size=8, num_blocks=2, steps_per_block=16)
    result = await run_chain(ReferenceEngine(model), [2], config, traversal=traversal, seed=5)
    assert result.stats.transitions == 32
    assert [t.k for t in result.transitions] == list(range(16)) * 2
    assert result.stats.rounds < 32
    assert result.stats.requests_used == 32
    assert result.stats.requests_issued >= result.stats.requests_used
    assert len(result.full_token_ids) == 16


async def test_eos_truncation_keeps_the_first_eos() -> None:
    model = ReferenceModel(3, seed=0)
    config = SamplerConfig(block_size=12, steps_per_block=4, eos_token_id=2)
    result = await run_chain(ReferenceEngine(model), [0], config, traversal="crn", seed=1)
    full = result.full_token_ids
    assert 2 in full  # with 3 tokens and 12 positions, EOS appears for this seed
    assert result.token_ids == full[: full.index(2) + 1]
