"""The stop rule (method §2 step 3): a chain stops after the block whose state holds an EOS.

The rule reads only the state at the end of a block, so it is part of the sequential chain:
every replaying traversal must stop at the same block with the same tokens and decisions, and
the law of the finished chains of every traversal is the sequential procedure's, enumerated here
on the tiny reference model. The three ways an EOS meets the rule are each exercised (an EOS
that arrives in a block's extension, one that an accepted proposal brings, one that a later
accept removes before the block ends), and a stream that keeps its speculated next-block
extension after a stop is caught.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from presto_client.core.chain_runner import ChainSetup
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.runners import ChainResult, run_chain
from presto_client.core.sampler_config import TRAVERSALS, SamplerConfig, replaying_names
from presto_client.core.sequential_runner import SequentialRunner
from presto_client.core.state import ChainState
from presto_client.core.stream.walk import StreamRunner
from tests.support import exact_law as exact

SAMPLERS = ("power_mh", "entropy_cut", "multi_try_mh")
EOS = 5
PROMPT = (1, 2)


def _config(sampler: str, **changes: object) -> SamplerConfig:
    base = SamplerConfig(
        sampler=sampler, block_size=6, num_blocks=4, steps_per_block=8, eos_token_id=EOS
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def _walk(result: ChainResult) -> list[tuple[int, int, int, bool, int]]:
    """Decisions; which candidate a rejection names is no part of the chain (an early
    rejection decides before every candidate is in)."""
    return [
        (t.block, t.k, t.cut, t.accepted, t.selected if t.accepted else -1)
        for t in result.transitions
    ]


class _WatchedSequential(SequentialRunner):
    """The sequential chain, noting how EOS entered or left its state (the scenarios)."""

    def __init__(self, setup: ChainSetup) -> None:
        super().__init__(setup)
        self.events: set[str] = set()

    def _has_eos(self, state: ChainState) -> bool:
        return bool((state.response.token_ids == self.config.eos_token_id).any())

    async def _extend(self, state: ChainState, block: int) -> ChainState:
        extended = await super()._extend(state, block)
        if not self._has_eos(state) and self._has_eos(extended):
            self.events.add("extension")
        return extended

    async def _advance(self, state: ChainState, block: int, k: int) -> tuple[ChainState, int]:
        after, done = await super()._advance(state, block, k)
        before_eos, after_eos = self._has_eos(state), self._has_eos(after)
        if not before_eos and after_eos:
            self.events.add("accepted")
        if before_eos and not after_eos:
            self.events.add("removed")
        return after, done


async def _sequential(
    model: ReferenceModel, config: SamplerConfig, seed: int
) -> tuple[ChainResult, set[str]]:
    runner = _WatchedSequential(ChainSetup(ReferenceEngine(model), config, seed))
    result = await runner.run(PROMPT)
    return result, runner.events


# A model and EOS per sampler under which, in ten seeds, each scenario happens.
SCENARIO_MODELS = {"power_mh": (7, 7), "entropy_cut": (7, 7), "multi_try_mh": (8, 0)}


@pytest.mark.parametrize("sampler", SAMPLERS)
async def test_every_replaying_traversal_stops_where_the_sequential_chain_stops(
    sampler: str,
) -> None:
    model_seed, eos = SCENARIO_MODELS[sampler]
    model = ReferenceModel(8, seed=model_seed)
    config = _config(sampler, eos_token_id=eos)
    seen: Counter[str] = Counter()
    stopped = 0
    for seed in range(10):
        baseline, events = await _sequential(model, config, seed)
        seen.update(events)
        stopped += baseline.stats.stopped_at_eos
        full = baseline.full_token_ids
        if baseline.stats.stopped_at_eos:
            assert eos in full and len(full) == 6 * baseline.stats.blocks_run < 24
            assert baseline.token_ids == full[: full.index(eos) + 1]
            assert baseline.stats.response_tokens == len(baseline.token_ids)
        for traversal, size in (("crn", 8), ("stream", 1), ("stream", 3), ("stream", None)):
            other = await run_chain(
                ReferenceEngine(model), PROMPT, config, traversal=traversal, size=size, seed=seed
            )
            where = f"{traversal}/{size} seed {seed}"
            assert other.full_token_ids == full, where
            assert other.token_ids == baseline.token_ids, where
            assert _walk(other) == _walk(baseline), where
            assert other.stats.blocks_run == baseline.stats.blocks_run, where
            assert other.stats.stopped_at_eos == baseline.stats.stopped_at_eos, where
    # The scenarios really happened: an EOS brought by an extension, by an accepted proposal,
    # and one a later accept removed before the block ended; and chains did stop early.
    assert seen["extension"] > 0 and seen["accepted"] > 0 and seen["removed"] > 0, seen
    assert 0 < stopped < 10


async def test_stopping_runs_fewer_blocks_than_the_budget_and_off_runs_them_all() -> None:
    model = ReferenceModel(8, seed=11)
    on = _config("power_mh")
    off = replace(on, stop_at_eos=False)
    fewer = 0
    for seed in range(6):
        stopping = await run_chain(
            ReferenceEngine(model), PROMPT, on, traversal="stream", seed=seed
        )
        every = await run_chain(ReferenceEngine(model), PROMPT, off, traversal="stream", seed=seed)
        assert every.stats.blocks_run == 4 and not every.stats.stopped_at_eos
        assert len(every.full_token_ids) == 24
        # Up to the stop both are the same chain: same first blocks, same decisions.
        n = stopping.stats.blocks_run
        assert every.full_token_ids[: 6 * n] == stopping.full_token_ids or n < 4
        assert _walk(every)[: 8 * n] == _walk(stopping)
        fewer += n < 4
    assert fewer > 0


async def test_without_an_eos_token_every_block_runs() -> None:
    model = ReferenceModel(8, seed=11)
    config = _config("power_mh", eos_token_id=None)
    result = await run_chain(ReferenceEngine(model), PROMPT, config, traversal="stream", seed=0)
    assert result.stats.blocks_run == 4 and len(result.full_token_ids) == 24


class _KeepsTheNextBlock(StreamRunner):
    """A wrong stream: it speculates the next block from a state holding an EOS and, when
    that extension is in flight, runs the next block instead of stopping."""

    def _may_continue_from(self, state: ChainState) -> bool:
        return True

    def _stops(self, state: ChainState) -> bool:
        return super()._stops(state) and self._next is None


async def test_a_stream_that_keeps_a_speculated_next_block_after_a_stop_is_caught() -> None:
    model = ReferenceModel(8, seed=11)
    config = _config("power_mh")
    caught = 0
    for seed in range(10):
        baseline, _ = await _sequential(model, config, seed)
        wrong = await _KeepsTheNextBlock(ChainSetup(ReferenceEngine(model), config, seed)).run(
            PROMPT
        )
        caught += wrong.full_token_ids != baseline.full_token_ids
    assert caught > 0


# ---- the law of finished chains, with the stop rule, enumerated


LAW_CASES = {
    "power_mh": (
        ReferenceModel(3, seed=2),
        SamplerConfig(block_size=2, num_blocks=2, steps_per_block=4, tau=1.0, eos_token_id=2),
    ),
    "entropy_cut": (
        ReferenceModel(3, seed=4),
        SamplerConfig(
            sampler="entropy_cut",
            block_size=2,
            num_blocks=2,
            steps_per_block=4,
            tau=1.0,
            eos_token_id=2,
        ),
    ),
    "multi_try_mh": (
        ReferenceModel(3, seed=2),
        SamplerConfig(
            sampler="multi_try_mh",
            block_size=2,
            num_blocks=2,
            steps_per_block=4,
            k_try=2,
            eos_token_id=2,
        ),
    ),
}
LAW_PROMPT = (0,)


async def _outcome_counts(
    model: ReferenceModel,
    config: SamplerConfig,
    traversal: str,
    keys: list[tuple[int, ...]],
    chains: int,
) -> np.ndarray:
    index = {k: i for i, k in enumerate(keys)}
    counts = np.zeros(len(keys) + 1)  # the last cell: an outcome the law gives no mass
    engine = ReferenceEngine(model)
    for seed in range(chains):
        result = await run_chain(engine, LAW_PROMPT, config, traversal=traversal, size=4, seed=seed)
        counts[index.get(result.full_token_ids, len(keys))] += 1
    return counts


def test_the_enumerated_law_with_the_stop_rule_is_a_law() -> None:
    model, config = LAW_CASES["power_mh"]
    law = exact.law_with_stop(model, LAW_PROMPT, config)
    assert abs(sum(law.values()) - 1.0) < 1e-9
    stopped = sum(p for x, p in law.items() if len(x) == 2)
    assert all(2 in x for x in law if len(x) == 2)
    assert 0.2 < stopped < 0.9  # both outcomes are common: the test below sees both
    without = exact.law_after(model, LAW_PROMPT, replace(config, stop_at_eos=False))
    assert abs(without.sum() - 1.0) < 1e-9


# The sequential chain and the traversals that do not replay it token for token (``crn`` and
# ``stream`` do: the replay test above holds them to the sequential chain, stop included).
LAW_TRAVERSALS = ("sequential", *(t for t in TRAVERSALS if t not in replaying_names()))


@pytest.mark.slow
@pytest.mark.parametrize("traversal", LAW_TRAVERSALS)
@pytest.mark.parametrize("case", sorted(LAW_CASES))
async def test_finished_chains_follow_the_law_with_the_stop_rule(case: str, traversal: str) -> None:
    model, config = LAW_CASES[case]
    law = exact.law_with_stop(model, LAW_PROMPT, config)
    keys = sorted(law)
    probs = np.array([law[k] for k in keys] + [0.0])
    counts = await _outcome_counts(model, config, traversal, keys, chains=800)
    p_value = exact.chi_square_test(counts, probs)
    assert p_value > 1e-4, f"{case}/{traversal}: p = {p_value:.3g}"


class _StopsBeforeTheTransitions(SequentialRunner):
    """A wrong stop rule: it reads the state right after the extension, so a block whose
    extension brings an EOS skips its transitions (the reference rule reads the state after
    them)."""

    async def _run_block(self, state: ChainState, block: int) -> ChainState:
        state = await self._extend(state, block)
        if self._stops(state):
            return state
        for k in range(self.config.steps_per_block):
            state, _ = await self._advance(state, block, k)
        return state


@pytest.mark.slow
async def test_the_law_test_catches_a_stop_read_at_the_wrong_time() -> None:
    model, config = LAW_CASES["power_mh"]
    law = exact.law_with_stop(model, LAW_PROMPT, config)
    keys = sorted(law)
    index = {k: i for i, k in enumerate(keys)}
    probs = np.array([law[k] for k in keys] + [0.0])
    counts = np.zeros(len(keys) + 1)
    engine = ReferenceEngine(model)
    for seed in range(800):
        result = await _StopsBeforeTheTransitions(ChainSetup(engine, config, seed)).run(LAW_PROMPT)
        counts[index.get(result.full_token_ids, len(keys))] += 1
    assert exact.chi_square_test(counts, probs) < 1e-4
