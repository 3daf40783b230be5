"""The compute-matched baselines: best-of-N, majority vote and Power-SMC.

Power-SMC is approximate: its answers follow ``π_α`` only as the particles grow. That is tested
against the enumerated target on the tiny reference model (the total variation falls with the
particles, and a version without the weights stays far), as are the picks of best-of-N and the
samples a majority vote keeps.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from presto_client.core.chain_runner import ChainSetup
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.runners import run_chain
from presto_client.core.sample_baselines import PowerSMCRunner
from presto_client.core.sampler_config import SamplerConfig
from presto_client.core.shared_draws import SharedDraws
from tests.support import exact_law as exact

PROMPT = (0,)


async def test_best_of_n_keeps_its_most_likely_sample() -> None:
    model = ReferenceModel(6, seed=3)
    config = SamplerConfig(block_size=4, num_blocks=2)
    better = 0
    for seed in range(8):
        one = await run_chain(
            ReferenceEngine(model), PROMPT, config, traversal="best_of_n", size=1, seed=seed
        )
        many = await run_chain(
            ReferenceEngine(model), PROMPT, config, traversal="best_of_n", size=8, seed=seed
        )
        # Sample 0 is among the eight (draws are keyed by sample and block), so the best of
        # eight is at least as likely, per token, as sample 0 alone.
        assert many.stats.final_mean_logp0 >= one.stats.final_mean_logp0 - 1e-12
        better += many.stats.final_mean_logp0 > one.stats.final_mean_logp0
        assert many.stats.requests_issued == 16 and many.stats.rounds == 2
        assert many.stats.tokens_generated == 8 * 8
    assert better > 0


async def test_majority_vote_keeps_every_sample_and_stops_each_at_its_eos() -> None:
    model = ReferenceModel(6, seed=3)
    config = SamplerConfig(block_size=4, num_blocks=4, eos_token_id=5)
    result = await run_chain(
        ReferenceEngine(model), PROMPT, config, traversal="majority_vote", size=6, seed=2
    )
    answers = [result.token_ids, *result.alternatives]
    assert len(answers) == 6
    for answer in answers:
        assert 5 not in answer[:-1]  # truncated after its first EOS
        assert len(answer) <= 16
    # Samples that ended stopped generating: fewer tokens than six full budgets.
    ended = sum(1 for a in answers if a and a[-1] == 5)
    assert ended > 0
    assert result.stats.tokens_generated < 6 * 16 or ended == 0


async def _answer_counts(
    model: ReferenceModel, config: SamplerConfig, particles: int, chains: int, runner: type
) -> np.ndarray:
    counts = np.zeros(model.vocab_size**config.response_length)
    engine = ReferenceEngine(model)
    for seed in range(chains):
        result = await runner(ChainSetup(engine, config, seed, size=particles)).run(PROMPT)
        counts[exact.state_index(result.full_token_ids, model.vocab_size)] += 1
    return counts


class _Unweighted(PowerSMCRunner):
    """A wrong Power-SMC: no importance weights (particles from ``q_τ``, picked uniformly)."""

    def _log_increment(self, extension):  # type: ignore[no-untyped-def]
        return 0.0


SMC_MODEL = ReferenceModel(3, seed=1)
SMC_CONFIG = SamplerConfig(block_size=2, num_blocks=2, tau=1.0, alpha=3.0)


def _tv(counts: np.ndarray, target: np.ndarray) -> float:
    return 0.5 * float(np.abs(counts / counts.sum() - target).sum())


@pytest.mark.slow
async def test_power_smc_approaches_the_power_target_as_the_particles_grow() -> None:
    target = exact.target(SMC_MODEL, PROMPT, SMC_CONFIG.response_length, SMC_CONFIG.alpha)
    tv = {}
    for n in (1, 4, 32):
        counts = await _answer_counts(SMC_MODEL, SMC_CONFIG, n, 800, PowerSMCRunner)
        tv[n] = _tv(counts, target)
    wrong = _tv(await _answer_counts(SMC_MODEL, SMC_CONFIG, 32, 800, _Unweighted), target)
    assert tv[1] > tv[4] > tv[32], tv
    assert tv[32] < 0.12, tv  # the sampling noise of 800 answers over 81 states is ~0.04 here
    assert wrong > 3 * tv[32], (wrong, tv)


async def test_power_smc_resamples_only_below_its_threshold() -> None:
    engine = ReferenceEngine(SMC_MODEL)
    seen = {}
    for threshold in (1e-9, 1.0):
        config = replace(SMC_CONFIG, smc_ess_threshold=threshold, num_blocks=3)
        runner = PowerSMCRunner(ChainSetup(engine, config, 4, size=16))
        resampled = []
        original = runner._after_block

        def spy(particles, block, original=original, resampled=resampled):  # type: ignore[no-untyped-def]
            after = original(particles, block)
            resampled.append(after is not particles)
            return after

        runner._after_block = spy  # type: ignore[method-assign]
        await runner.run(PROMPT)
        seen[threshold] = resampled
    assert not any(seen[1e-9])  # the ESS never falls below ~0
    assert any(seen[1.0])  # unequal weights always fall below N


class _CountingEngine(ReferenceEngine):
    """The reference engine, counting its proposal calls (and failing them on demand)."""

    def __init__(self, model: ReferenceModel, fail: bool = False) -> None:
        super().__init__(model)
        self.calls = 0
        self.fail = fail

    async def generate(self, requests):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.fail:
            raise ConnectionError("the server went away")
        return await super().generate(requests)


async def test_best_of_n_and_majority_vote_read_one_draw_with_the_answers_of_two() -> None:
    model = ReferenceModel(6, seed=3)
    config = SamplerConfig(block_size=4, num_blocks=3, eos_token_id=5)
    for seed in range(6):
        alone = {}
        for arm in ("best_of_n", "majority_vote"):
            alone[arm] = await run_chain(
                ReferenceEngine(model), PROMPT, config, traversal=arm, size=5, seed=seed
            )
        engine = _CountingEngine(model)
        draws = SharedDraws()
        together = await asyncio.gather(
            *(
                run_chain(engine, PROMPT, config, traversal=arm, size=5, seed=seed, draws=draws)
                for arm in ("majority_vote", "best_of_n")
            )
        )
        # One draw's calls (a block each while a sample runs), not two.
        assert engine.calls == alone["best_of_n"].stats.rounds
        for arm, result in zip(("majority_vote", "best_of_n"), together, strict=True):
            assert result.token_ids == alone[arm].token_ids
            assert result.alternatives == alone[arm].alternatives
            assert result.stats.tokens_generated == alone[arm].stats.tokens_generated
            assert result.stats.blocks_run == alone[arm].stats.blocks_run
        assert [r.stats.shared_draw for r in together] == [False, True]
        assert not draws._draws  # read, then dropped


async def test_a_failed_drawer_leaves_the_reader_to_draw_its_own() -> None:
    model = ReferenceModel(6, seed=3)
    config = SamplerConfig(block_size=4, num_blocks=2)
    draws = SharedDraws()
    broken = _CountingEngine(model, fail=True)
    good = _CountingEngine(model)
    first = asyncio.ensure_future(
        run_chain(broken, PROMPT, config, traversal="best_of_n", size=3, seed=1, draws=draws)
    )
    await asyncio.sleep(0)  # the drawer holds the draw before the reader asks
    second = await run_chain(
        good, PROMPT, config, traversal="majority_vote", size=3, seed=1, draws=draws
    )
    with pytest.raises(ConnectionError):
        await first
    alone = await run_chain(
        ReferenceEngine(model), PROMPT, config, traversal="majority_vote", size=3, seed=1
    )
    assert good.calls == 2 and not second.stats.shared_draw
    assert second.token_ids == alone.token_ids and second.alternatives == alone.alternatives


async def test_a_cancelled_reader_does_not_cancel_the_draw() -> None:
    model = ReferenceModel(6, seed=3)
    config = SamplerConfig(block_size=4, num_blocks=2)
    draws = SharedDraws()
    release = asyncio.Event()

    class _SlowEngine(ReferenceEngine):
        async def generate(self, requests):  # type: ignore[no-untyped-def]
            await release.wait()
            return await super().generate(requests)

    drawer = asyncio.ensure_future(
        run_chain(_SlowEngine(model), PROMPT, config, traversal="best_of_n", size=3, draws=draws)
    )
    await asyncio.sleep(0)
    reader = asyncio.ensure_future(
        run_chain(
            _SlowEngine(model), PROMPT, config, traversal="majority_vote", size=3, draws=draws
        )
    )
    await asyncio.sleep(0)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    release.set()
    result = await drawer
    assert result.stats.rounds == 2 and not result.stats.shared_draw


async def test_unread_draws_are_pushed_out_after_keep_newer_ones() -> None:
    model = ReferenceModel(6, seed=3)
    config = SamplerConfig(block_size=4, num_blocks=1)
    draws = SharedDraws(keep=3)
    for seed in range(10):
        await run_chain(
            ReferenceEngine(model),
            PROMPT,
            config,
            traversal="best_of_n",
            size=2,
            seed=seed,
            draws=draws,
        )
    assert len(draws._draws) == 3


async def test_power_smc_never_reads_a_shared_draw() -> None:
    model = ReferenceModel(6, seed=3)
    config = SamplerConfig(block_size=4, num_blocks=2)
    draws = SharedDraws()
    await run_chain(
        ReferenceEngine(model), PROMPT, config, traversal="best_of_n", size=3, draws=draws
    )
    smc = await run_chain(
        ReferenceEngine(model), PROMPT, config, traversal="power_smc", size=3, draws=draws
    )
    assert not smc.stats.shared_draw and len(draws._draws) == 1
