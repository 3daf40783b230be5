"""The tree rules (``bfs``, ``predictive``) on the sequential chain's draws where the tree's
state is the root's: a round that speculates nothing is the sequential chain's transition, so
an engine whose cost leaves no room for speculation runs the sequential chain itself, not
another chain of the same law (with its own, possibly longer, proposals)."""

from __future__ import annotations

import pytest

from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.runners import ChainResult, run_chain
from presto_client.core.sampler_config import SamplerConfig

SAMPLERS = ("power_mh", "entropy_cut", "multi_try_mh")


def _decisions(result: ChainResult) -> list[tuple[int, int, int, bool, int]]:
    return [(t.block, t.k, t.cut, t.accepted, t.selected) for t in result.transitions]


@pytest.mark.parametrize("traversal", ["bfs", "predictive"])
@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("seed", [0, 3])
async def test_a_tree_of_one_proposal_per_round_is_the_sequential_chain(
    traversal: str, sampler: str, seed: int
) -> None:
    model = ReferenceModel(12, seed=7)
    config = SamplerConfig(sampler=sampler, block_size=8, num_blocks=2, steps_per_block=12)
    baseline = await run_chain(
        ReferenceEngine(model), [3, 1], config, traversal="sequential", seed=seed
    )
    tree = await run_chain(
        ReferenceEngine(model), [3, 1], config, traversal=traversal, size=1, seed=seed
    )
    assert tree.stats.requests_issued == tree.stats.requests_used == 24
    assert tree.full_token_ids == baseline.full_token_ids
    assert _decisions(tree) == _decisions(baseline)


@pytest.mark.parametrize("traversal", ["bfs", "predictive"])
async def test_a_tree_on_the_all_reject_path_follows_the_sequential_chain(traversal: str) -> None:
    """Rounds of many proposals: every transition up to the first accept reached below a
    round's root is the sequential chain's (the spine's draws are the transitions')."""
    model = ReferenceModel(12, seed=7)
    config = SamplerConfig(block_size=8, num_blocks=1, steps_per_block=16)
    for seed in range(6):
        baseline = await run_chain(
            ReferenceEngine(model), [3, 1], config, traversal="sequential", seed=seed
        )
        tree = await run_chain(
            ReferenceEngine(model), [3, 1], config, traversal=traversal, size=8, seed=seed
        )
        common = 0
        for ours, theirs in zip(_decisions(tree), _decisions(baseline), strict=True):
            if ours != theirs:
                break
            common += 1
        # the first transition is a round's root; every one after it is a spine node or a
        # later root until an accept below a root sends the walk off the spine
        assert common >= 1
        first_accept = next((i for i, t in enumerate(baseline.transitions) if t.accepted), None)
        if first_accept is not None:
            assert common >= first_accept + 1
