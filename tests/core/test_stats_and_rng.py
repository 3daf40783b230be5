"""Per-chain statistics, round records, and randomness keyed by transition."""

from __future__ import annotations

import pytest

from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.rng import ChainRandomness, chain_seeds
from presto_client.core.runners import run_chain
from presto_client.core.sampler_config import SamplerConfig
from presto_client.core.stats import RoundRecord


@pytest.mark.parametrize("traversal", ["sequential", "bfs", "predictive", "crn", "stream"])
@pytest.mark.parametrize("sampler", ["power_mh", "multi_try_mh"])
async def test_statistics_agree_with_round_records(traversal: str, sampler: str) -> None:
    records: list[RoundRecord] = []
    config = SamplerConfig(sampler=sampler, block_size=6, num_blocks=2, steps_per_block=12, k_try=3)
    engine = ReferenceEngine(ReferenceModel(6, seed=2), top_k=4)
    result = await run_chain(
        engine, [1], config, traversal=traversal, size=6, seed=3, on_round=records.append
    )
    stats = result.stats
    proposes = [r for r in records if r.kind in ("propose", "stream")]
    extends = [r for r in records if r.kind == "extend"]
    tightens = [r for r in records if r.kind == "tighten"]
    assert [r.round for r in records] == list(range(len(records)))
    assert len(extends) == stats.extend_calls == 2
    assert len(proposes) == stats.rounds
    if traversal == "sequential":
        assert stats.rounds == engine.generate_calls - 2
    elif traversal == "stream":  # proposals and extensions are streamed; a record is one wait
        assert engine.generate_calls == 0 and stats.rounds <= stats.transitions
    else:  # one engine call per proposal of a round; cancelled ones may never reach the engine
        assert stats.rounds <= engine.generate_calls - 2 <= stats.requests_issued
    assert len(tightens) == stats.tighten_calls == stats.ambiguous == engine.score_calls
    assert stats.transitions == sum(r.transitions for r in proposes) == 24
    assert (
        stats.accepts
        == sum(r.accepts for r in proposes)
        == sum(t.accepted for t in result.transitions)
    )
    assert stats.requests_issued == sum(r.requests for r in proposes)
    assert stats.requests_used == sum(r.used for r in proposes) == 24
    assert stats.sequences_issued == sum(r.sequences for r in proposes)
    assert stats.sequences_issued == stats.requests_issued * config.k_try ** (
        sampler == "multi_try_mh"
    )
    assert stats.tokens_generated == sum(r.tokens for r in records)
    assert stats.eps_certain == sum(t.eps_certain for t in result.transitions)
    assert len(stats.call_wall_s) == stats.rounds
    assert stats.transitions_per_call == pytest.approx(24 / stats.rounds)
    assert stats.wasted_requests == stats.requests_issued - 24
    assert stats.drift_max < 1e-9  # the reference engine has no numerical drift
    final = result.final_state.response.slice(0, len(result.token_ids))
    assert stats.final_mean_logp0 == pytest.approx(float(final.logp0.mean()))
    assert stats.final_mean_neg_entropy is None  # PowerMH/MultiTryMH states keep no entropy
    summary = stats.as_dict()
    assert summary["transitions"] == 24 and summary["acceptance_rate"] == stats.acceptance_rate


def test_draws_depend_only_on_their_key() -> None:
    a = ChainRandomness(11, k_try=4, num_temperatures=3)
    b = ChainRandomness(11, k_try=4, num_temperatures=3)
    assert a.transition(0, 5) == b.transition(0, 5)
    assert a.transition(0, 5) != a.transition(0, 6)
    assert a.transition(0, 5) != a.transition(1, 5)
    assert a.transition(0, 5) != ChainRandomness(12, 4, 3).transition(0, 5)
    assert a.node(0, 2, (True,)) != a.node(0, 2, (False,))
    assert a.node(0, 2, ()) != a.node(0, 3, ())
    assert a.node(0, 2, (False,)) != a.node(0, 2, (False, False))
    d = a.transition(2, 3)
    assert len(d.seeds) == 4 and all(0 <= i < 3 for i in d.temperature_index)
    assert 0.0 < d.u_accept <= 1.0 and 0.0 <= d.u_cut < 1.0
    assert a.extension_seed(0) != a.extension_seed(1)


def test_chain_seeds_split_one_root_seed() -> None:
    seeds = chain_seeds(42, 100)
    assert seeds == chain_seeds(42, 100)
    assert len(set(seeds)) == 100
    assert chain_seeds(42, 3) == seeds[:3]
    assert chain_seeds(43, 3) != seeds[:3]


def test_a_tree_node_without_an_accept_on_its_path_is_the_sequential_transition() -> None:
    a = ChainRandomness(11, k_try=2, num_temperatures=3)
    assert a.node(0, 2, ()) == a.transition(0, 2)  # a round's root
    assert a.node(1, 2, (False, False)) == a.transition(1, 4)  # the all-reject spine
    # below an accept the node's state is not the root's: its own key, unlike any transition's
    off_spine = a.node(0, 2, (False, True))
    assert off_spine not in {a.transition(0, k) for k in range(8)}
    assert off_spine != a.node(0, 2, (True, False))
