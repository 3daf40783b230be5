"""The ``stream`` traversal with the window sized by the engine (no cap) and the block's own
generation overlapped: replay of the sequential chain for every sampler over several blocks,
under out-of-order completion, closed streams and broken streams (an extension stream that breaks
after sending tokens of another sample, so that the prefix proposals were issued from is
rewritten); the negative controls show that the replay check catches a proposal kept although an
accept rewrote its prefix, and one issued past the tokens received so far."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections.abc import AsyncIterator, Sequence

import numpy as np
import pytest

from presto_client.core import chain_runner
from presto_client.core.chain_runner import ChainSetup
from presto_client.core.engine_protocol import ProposalRequest, ScoredTokens, ScoreRequest
from presto_client.core.kernels import make_kernel
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.rng import ChainRandomness
from presto_client.core.runners import run_chain
from presto_client.core.sampler_config import SamplerConfig
from presto_client.core.speculation import MIN_OBSERVATIONS, SpeculationBudget
from presto_client.core.state import ChainState
from presto_client.core.stream import policy as stream_policy
from presto_client.core.stream import tuning
from presto_client.core.stream.flight import SPECULATIVE, InFlight, join_chunks
from presto_client.core.stream.rule import StreamRuleError
from presto_client.core.stream.walk import StreamRunner
from presto_client.errors import EngineUnavailableError
from tests.core.test_stream import _walk

SAMPLERS = ("power_mh", "entropy_cut", "multi_try_mh")


def _floor(monkeypatch: pytest.MonkeyPatch, value: float) -> None:
    """Every runner made from here on gets the default tuning with this survival floor."""
    monkeypatch.setattr(
        tuning, "DEFAULT_TUNING", dataclasses.replace(tuning.DEFAULT_TUNING, survival_floor=value)
    )


class UnrulyEngine:
    """The reference engine's answers, streamed in random chunks at random times.

    Some streams break midway (a retryable error, as a dropped connection); an extension stream
    that breaks first sends tokens of another sample, as a server that samples afresh on the
    retry would: what was received before the break is not the block's extension. Records, for
    each proposal stream, whether an extension was streaming when it started, and the most
    proposal streams open at once.
    """

    def __init__(
        self,
        inner: ReferenceEngine,
        *,
        seed: int,
        extension_seeds: set[int],
        break_probability: float = 0.0,
    ) -> None:
        self.inner = inner
        self.name = "unruly"
        self.rng = random.Random(seed)
        self.extension_seeds = extension_seeds
        self.break_probability = break_probability
        self.open_extensions = 0
        self.open_proposals = 0
        self.peak_proposals = 0
        self.open_streams = 0
        self.started_during_extension = 0
        self.extensions_during_walk = 0
        self.breaks = 0
        self.rewritten = 0
        self.closed_early = 0
        self._broken: set[tuple[tuple[int, ...], int]] = set()

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        return await self.inner.generate(requests)

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoredTokens]:
        return await self.inner.score(requests)

    async def aclose(self) -> None:
        return None

    async def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        (whole,) = await self.inner.generate([request])
        extension = request.seed in self.extension_seeds
        key = (request.prefix, request.seed)
        breaks = (
            len(whole) > 1
            and key not in self._broken
            and self.rng.random() < self.break_probability
        )
        source = whole
        if breaks and extension:  # the tokens before the break are another sample's
            other = dataclasses.replace(request, seed=(request.seed + 7919) % (2**31 - 1))
            (source,) = await self.inner.generate([other])
            self.rewritten += int(not np.array_equal(source.token_ids, whole.token_ids))
        breaks_at = self.rng.randrange(1, len(whole)) if breaks else None
        self.open_streams += 1
        if extension:
            self.extensions_during_walk += int(self.open_proposals > 0)
            self.open_extensions += 1
        else:
            self.started_during_extension += int(self.open_extensions > 0)
            self.open_proposals += 1
            self.peak_proposals = max(self.peak_proposals, self.open_proposals)
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
                    self._broken.add(key)
                    raise EngineUnavailableError(
                        "the stream broke", engine=self.name, retryable=True
                    )
                n = self.rng.randint(1, 3)
                if breaks_at is not None:  # a stream that breaks sends only what precedes it
                    n = min(n, breaks_at - i)
                yield source.slice(i, i + n)
                i += n
            finished = True
        finally:
            self.open_streams -= 1
            if extension:
                self.open_extensions -= 1
            else:
                self.open_proposals -= 1
            if not finished:
                self.closed_early += 1


def _extension_seeds(config: SamplerConfig, seed: int) -> set[int]:
    randomness = ChainRandomness(seed)
    return {randomness.extension_seed(b) for b in range(config.num_blocks)}


async def _replays(
    sampler: str,
    seeds: range,
    *,
    break_probability: float = 0.3,
    top_k: int | None = 4,
    window: int | None = None,
) -> tuple[bool, dict[str, int]]:
    """Whether every chain replayed the sequential chain, and what the scenario exercised."""
    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(sampler=sampler, block_size=10, num_blocks=2, steps_per_block=16)
    totals = dict.fromkeys(
        ("early", "next", "breaks", "rewritten", "cancelled", "closed", "peak", "rejected_early"),
        0,
    )
    same = True
    for seed in seeds:
        baseline = await run_chain(
            ReferenceEngine(model, top_k=top_k), [2], config, traversal="sequential", seed=seed
        )
        engine = UnrulyEngine(
            ReferenceEngine(model, top_k=top_k),
            seed=seed,
            extension_seeds=_extension_seeds(config, seed),
            break_probability=break_probability,
        )
        stream = await run_chain(engine, [2], config, traversal="stream", size=window, seed=seed)
        same = same and (
            stream.full_token_ids == baseline.full_token_ids and _walk(stream) == _walk(baseline)
        )
        assert engine.open_streams == 0  # every stream finished or was closed
        assert stream.stats.transitions == 32 and stream.stats.requests_used == 32
        totals["early"] += engine.started_during_extension
        totals["next"] += engine.extensions_during_walk
        totals["breaks"] += engine.breaks
        totals["rewritten"] += engine.rewritten
        totals["cancelled"] += stream.stats.requests_cancelled
        totals["closed"] += engine.closed_early
        totals["peak"] = max(totals["peak"], engine.peak_proposals)
        totals["rejected_early"] += stream.stats.early_rejects
    return same, totals


@pytest.mark.parametrize("sampler", SAMPLERS)
async def test_the_engine_sized_overlapped_window_replays_the_sequential_chain(
    sampler: str,
) -> None:
    """No cap, proposals issued while each block's extension streams, two blocks, streams that
    complete out of order, are closed (accepts, early rejections) and break (extensions
    rewritten before the break): the chain is the sequential chain, token for token and
    decision for decision."""
    same, totals = await _replays(sampler, range(5))
    assert same
    # The scenario exercised what it claims to.
    assert totals["early"] > 0  # proposals started while an extension was streaming
    assert totals["next"] > 0  # the next block's extension started during this block's walk
    assert totals["peak"] > 4  # more in flight than a small window
    assert totals["breaks"] > 0 and totals["rewritten"] > 0
    assert totals["cancelled"] > 0 and totals["closed"] > 0


@pytest.mark.parametrize("top_k", [None, 5], ids=["exact", "top5-certified"])
@pytest.mark.parametrize("sampler", SAMPLERS)
async def test_the_overlap_replays_with_a_cap_too(sampler: str, top_k: int | None) -> None:
    same, _ = await _replays(sampler, range(3), break_probability=0.0, top_k=top_k, window=4)
    assert same


# ---- negative controls: the replay check catches the faults the overlap could make


async def test_replay_catches_a_proposal_kept_after_an_accept_rewrote_its_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The replay itself must catch it: the engine-health check (a normaliser gap between two
    # scorings of one context) would stop most such chains first.
    monkeypatch.setattr(chain_runner, "DRIFT_LIMIT", math.inf)
    monkeypatch.setattr(StreamRunner, "_usable", lambda self, flight, state: True)
    same, _ = await _replays("power_mh", range(5), break_probability=0.0)
    assert not same


def _prefix_only(self: StreamRunner, flight: InFlight, state: ChainState) -> bool:
    """A plausible check that compares only the tokens the proposal was issued after: right
    when they are the whole prefix, blind to a proposal issued before its prefix was in."""
    prefix = flight.response_prefix
    return bool(np.array_equal(state.response.token_ids[: len(prefix)], prefix))


async def test_replay_catches_a_proposal_issued_past_the_tokens_received(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The replay itself must catch it: the engine-health check (a normaliser gap between two
    # scorings of one context) would stop most such chains first.
    monkeypatch.setattr(chain_runner, "DRIFT_LIMIT", math.inf)
    monkeypatch.setattr(StreamRunner, "_usable", _prefix_only)
    same, totals = await _replays("power_mh", range(5), break_probability=0.0)
    assert same and totals["early"] > 0  # the weaker check alone is right for this runner
    # The walk's check and the policy's own filter both let a prefix not yet in go out.
    monkeypatch.setattr(StreamRunner, "_ready", lambda self, cut, received: True)
    monkeypatch.setattr(stream_policy, "ready", lambda cut, received: True)
    same, _ = await _replays("power_mh", range(5), break_probability=0.0)
    assert not same


async def test_replay_catches_proposals_kept_from_a_rewritten_extension(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the check at the extension's end, proposals issued from tokens that a broken
    stream's retry replaced would be used."""
    # The replay itself must catch it: the engine-health check (a normaliser gap between two
    # scorings of one context) would stop most such chains first.
    monkeypatch.setattr(chain_runner, "DRIFT_LIMIT", math.inf)
    same, totals = await _replays("power_mh", range(8), break_probability=0.5)
    assert same and totals["rewritten"] > 0
    monkeypatch.setattr(StreamRunner, "_confirm", lambda self, state: None)
    # The walk checks the rule again where it uses a proposal: it refuses to sample from one.
    with pytest.raises(StreamRuleError, match="transition"):
        await _replays("power_mh", range(8), break_probability=0.5)
    # Without that second check too, the replay check catches it.
    monkeypatch.setattr(StreamRunner, "_take", _unchecked_take)
    same, totals = await _replays("power_mh", range(8), break_probability=0.5)
    assert totals["rewritten"] > 0
    assert not same


def _unchecked_take(self: StreamRunner, m: int, state: ChainState) -> InFlight:
    """The walk's use without its check of the rule."""
    return self._window.pop(m)


async def test_replay_catches_a_next_extension_kept_after_an_accept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The next block's extension, speculated before this block's last transitions, is kept
    only if they leave the response as it was requested after."""
    # The replay itself must catch it: the engine-health check (a normaliser gap between two
    # scorings of one context) would stop most such chains first.
    monkeypatch.setattr(chain_runner, "DRIFT_LIMIT", math.inf)
    monkeypatch.setattr(StreamRunner, "_extension_usable", lambda self, issued, state: True)
    same, totals = await _replays("power_mh", range(8), break_probability=0.0)
    assert totals["next"] > 0
    assert not same


# ---- the window follows the engine's budget


def _fitted(a: float, b: float) -> SpeculationBudget:
    budget = SpeculationBudget(None)
    for i in range(4 * MIN_OBSERVATIONS):
        n = 1 + i % 8
        budget.observe(1, a + b * n, n)
    return budget


class _Counting(ReferenceEngine):
    """The reference engine on a deterministic clock: every chunk is one pass of the event loop
    (``asyncio.sleep(0)``, no timers), so each open stream advances one token per pass, as the
    sequences of a batched engine advance one token per decode step. What the window does is
    then the same on every machine, whatever its speed or load (a real-time sleep per chunk let
    the load decide which stream's tokens came first, and how far the window reached)."""

    def __init__(self, model: ReferenceModel) -> None:
        super().__init__(model)
        self.open = 0
        self.peak = 0

    async def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        self.open += 1
        self.peak = max(self.peak, self.open)
        try:
            async for chunk in super().stream(request):
                yield chunk
        finally:
            self.open -= 1


async def test_without_a_cap_the_window_reaches_every_remaining_transition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With every proposal worth its tokens (no survival floor) and an open budget the window
    holds every remaining transition; a cap bounds it."""
    _floor(monkeypatch, 0.0)
    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(block_size=40, steps_per_block=30)
    baseline = await run_chain(ReferenceEngine(model), [1], config, traversal="sequential", seed=1)
    engine = _Counting(model)
    result = await StreamRunner(ChainSetup(engine, config, 1, size=None)).run([1])
    assert result.full_token_ids == baseline.full_token_ids
    assert engine.peak > 20  # far past the old default cap of 16, towards K = 30
    capped = _Counting(model)
    await StreamRunner(ChainSetup(capped, config, 1, size=5)).run([1])
    assert capped.peak <= 5 + 1  # the cap (and the extension while it streams)


async def test_a_steep_engine_cost_pulls_the_window_back() -> None:
    """On a compute-bound engine (every sequence costs as much as the step's base) the budget
    allows ``tolerance·step(1)/b`` = 1 speculative sequence; past it a lone chain's proposal
    goes out only if at least ``b/step(heads)`` = 50 % likely to be used, and beside fifteen
    other chains' heads only if ``16·b/step(16)`` = 94 % likely. The window is compared with a
    flat engine's (``b = 0``: no tolerance binds) run on the same deterministic clock, in the
    same test: the steep cost holds it well below the flat one's, and past the tolerance fewer
    proposals go out beside other chains than alone."""
    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(block_size=40, steps_per_block=30)

    async def run(b: float, others: int, seed: int) -> tuple[list[float], int]:
        baseline = await run_chain(
            ReferenceEngine(model), [1], config, traversal="sequential", seed=seed
        )
        budget = _fitted(0.01, b)
        budget.observe = lambda *args: None  # type: ignore[method-assign]  # the event loop's
        budget.add_head(others)
        past: list[float] = []
        worth = budget.worth_past_the_tolerance  # asked only once the tolerance is spent

        def recording(sequences: int, used: float, own: int | None = None) -> bool:
            taken = worth(sequences, used, own)
            if taken:
                past.append(used)
            return taken

        budget.worth_past_the_tolerance = recording  # type: ignore[method-assign]
        engine = _Counting(model)
        runner = StreamRunner(ChainSetup(engine, config, seed, size=None, budget=budget))
        result = await runner.run([1])
        assert result.full_token_ids == baseline.full_token_ids
        return past, budget.peak_speculative

    lone_peaks, flat_peaks, lone_taken, shared_taken = [], [], 0, 0
    for seed in (1, 2, 3):
        past, lone_peak = await run(0.01, 0, seed)
        assert all(u >= 0.5 for u in past)  # past the tolerance: only proposals likely used
        shared_past, _ = await run(0.01, 15, seed)
        assert all(u >= 16 * 0.01 / 0.17 for u in shared_past)
        flat_past, flat_peak = await run(0.0, 0, seed)
        assert not flat_past  # a flat engine's tolerance never binds
        lone_peaks.append(lone_peak)
        flat_peaks.append(flat_peak)
        lone_taken += len(past)
        shared_taken += len(shared_past)
        assert lone_peak < flat_peak, (seed, lone_peak, flat_peak)
    assert lone_taken > 0  # the rule past the tolerance was exercised
    assert shared_taken < lone_taken
    # The steep cost pulls the window back: on the same clock its widest is at most two thirds
    # of the flat engine's (measured: 14/22, 8/26, 8/13).
    assert 3 * sum(lone_peaks) <= 2 * sum(flat_peaks), (lone_peaks, flat_peaks)


async def test_proposals_an_earlier_accept_would_likely_rewrite_wait() -> None:
    """The survival floor: a deep proposal with a small cut (few earlier transitions can rewrite
    its prefix) goes out, one with many earlier smaller cuts waits until the walk is nearer."""
    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(block_size=40, steps_per_block=30)
    runner = StreamRunner(ChainSetup(ReferenceEngine(model), config, 1, size=None))
    rate = runner.policy.accept_rate(runner.snapshot())  # the prior, 0.3
    assert runner.policy.survival([(5, rate), (30, rate), (30, rate)], 10) == pytest.approx(0.7)
    many = [(c, rate) for c in range(1, 10)]  # nine earlier smaller cuts: 0.7^9 = 0.04
    assert runner.policy.survival(many, 10) < tuning.DEFAULT_TUNING.survival_floor
    assert runner.policy.survival(many, 1) == 1.0
    assert runner.policy.survival([(5, 0.0)] * 9, 10) == 1.0  # known rejections threaten nothing
    assert runner.policy.survival([(5, 0.0), (7, 1.0)], 10) == 0.0  # a known accept rewrites it
    engine = _Counting(model)
    baseline = await run_chain(ReferenceEngine(model), [1], config, traversal="sequential", seed=1)
    result = await StreamRunner(ChainSetup(engine, config, 1, size=None)).run([1])
    assert result.full_token_ids == baseline.full_token_ids
    assert 1 < engine.peak < 30


@pytest.mark.parametrize("sampler", SAMPLERS)
async def test_a_complete_proposal_threatens_later_ones_by_its_decision(sampler: str) -> None:
    """Sizing reads a complete proposal's transition as decided: its odds of accepting are the
    kernel's decision against the walk's state (a rejection threatens nothing behind it); a
    proposal still streaming, or issued from a prefix the state no longer has, counts at the
    chain's acceptance rate."""
    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(sampler=sampler, block_size=24, steps_per_block=40)
    runner = StreamRunner(ChainSetup(ReferenceEngine(model), config, 1, size=None))
    kernel = runner.kernel
    (response,) = await runner.engine.generate([kernel.extension_request((2,), 5)])
    state = ChainState((2,), response)
    rate = runner.policy.accept_rate(runner.snapshot())
    flights = [runner._issue(state, 0, k, SPECULATIVE) for k in range(40)]
    assert all(
        runner.policy.threat(runner.snapshot(), f, state) == (f.cut, rate) for f in flights
    )  # none complete
    for flight in flights:
        while not flight.complete:
            flight.changed.clear()
            await flight.changed.wait()
    decisions = []
    for flight in flights:
        proposals = [join_chunks(c) for c in flight.chunks]
        verdict = kernel.evaluate(state, flight.cut, proposals, flight.draws)
        assert runner.policy.threat(runner.snapshot(), flight, state) == (
            flight.cut,
            float(verdict.accepted),
        )
        decisions.append(verdict.accepted)
    assert any(decisions) and not all(decisions)
    partial = ChainState((2,), response.slice(0, 10))  # the extension still streaming
    assert all(
        runner.policy.threat(runner.snapshot(), f, partial) == (f.cut, rate) for f in flights
    )
    (other,) = await runner.engine.generate([kernel.extension_request((2,), 6)])
    rewritten = ChainState((2,), other)
    differs = int(np.argmax(response.token_ids != other.token_ids))
    assert response.token_ids[differs] != other.token_ids[differs]
    past = [f for f in flights if f.cut > differs]
    assert past and all(
        runner.policy.threat(runner.snapshot(), f, rewritten) == (f.cut, rate) for f in past
    )
    for flight in flights:
        runner._close(flight)
    await runner._drain()


async def test_on_a_compute_bound_engine_only_proposals_likely_used_go_out() -> None:
    """Each speculative sequence slows every step by ``b/step(in flight)``: on an engine where
    that is 0.6 (a CPU serving one chain) a proposal goes out only if it is at least that likely
    to be used (here: at most one earlier transition at a smaller cut, 0.7 with the prior
    acceptance rate 0.3), while a flat engine sends every proposal over the survival floor; the
    cost limit is opened wide so that only this rule sizes the window."""

    tokens = [i % 10 for i in range(40)]
    state = ChainState((1,), ScoredTokens.exact(tokens, [-1.0] * 40, np.full((40, 1), -0.5)))

    async def refilled(a: float, b: float) -> tuple[float, dict[int, InFlight], StreamRunner]:
        budget = _fitted(a, b)
        budget.tolerance = 1e6
        model = ReferenceModel(10, seed=3)
        config = SamplerConfig(block_size=40, steps_per_block=30)
        runner = StreamRunner(ChainSetup(ReferenceEngine(model), config, 1, budget=budget))
        floor = runner.policy.survival_floor(
            runner.snapshot(), 1
        )  # as the refill sees it: the head alone in flight
        runner._enter_block(0)
        runner._refill(state, 0)
        window = dict(runner._window)
        return floor, window, runner

    steep_floor, steep, steep_runner = await refilled(0.01, 0.015)
    flat_floor, flat, flat_runner = await refilled(0.01, 0.0)
    assert steep_floor == pytest.approx(0.6) and flat_floor == tuning.DEFAULT_TUNING.survival_floor
    for floor, window, runner in (
        (steep_floor, steep, steep_runner),
        (flat_floor, flat, flat_runner),
    ):
        rate = runner.policy.accept_rate(
            runner.snapshot()
        )  # nothing is complete yet: every threat at the rate
        cuts = [(window[0].cut, rate)]
        for j in range(1, 30):
            draws = runner._transition_draws(0, j)
            cut = window[j].cut if j in window else runner.kernel.cut(state, draws.u_cut)
            assert (j in window) == (runner.policy.survival(cuts, cut) >= floor), j
            cuts.append((cut, rate))
        for flight in window.values():
            runner._close(flight)
        await runner._drain()
    assert 1 < len(steep) < len(flat)


async def test_a_transition_whose_prefix_is_not_in_keeps_its_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With room for one speculative MultiTryMH proposal and a half (six sequences), the first
    transition of the block gets one while the extension streams even when its cut lies late in
    it: a later transition with an earlier cut may take only half of what is left, and leaves the
    rest to it, since the walk needs it first. (Without the reservation later transitions take
    the room, and transition 0 goes out as the walk's head once the extension is in.)"""
    _floor(monkeypatch, 0.0)
    issued: list[tuple[int, str]] = []
    original = StreamRunner._issue

    def record(self: StreamRunner, *args: object, **kwargs: object) -> InFlight:
        issued.append((int(args[2]), str(args[3])))  # type: ignore[call-overload]
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(StreamRunner, "_issue", record)
    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(sampler="multi_try_mh", block_size=40, steps_per_block=30)
    for seed in range(3):
        baseline = await run_chain(
            ReferenceEngine(model), [1], config, traversal="sequential", seed=seed
        )
        issued.clear()
        # tolerance 0.5 of step(1 head) = a + b, b = a / 12.5: 6.75 speculative sequences, held
        # there (the run's own timings would move the fit)
        budget = _fitted(0.01, 0.01 / 12.5)
        monkeypatch.setattr(budget, "observe", lambda *args: None)
        runner = StreamRunner(ChainSetup(_Counting(model), config, seed, size=None, budget=budget))
        result = await runner.run([1])
        assert result.full_token_ids == baseline.full_token_ids
        first = next(role for k, role in issued if k == 0)
        assert first == SPECULATIVE, (seed, issued[:6])


def test_the_speculative_cut_is_the_cut_once_the_response_is_complete() -> None:
    rng = np.random.default_rng(0)
    for sampler in SAMPLERS:
        kernel = make_kernel(SamplerConfig(sampler=sampler, block_size=12))
        n = 12
        entropy = rng.random(n) * 2
        response = ScoredTokens(
            np.arange(n),
            -rng.random(n),
            -rng.random((n, len(kernel.score_spec.temperatures))),
            -rng.random((n, len(kernel.score_spec.temperatures))),
            entropy if kernel.score_spec.entropy else None,
        )
        response = dataclasses.replace(response, logq_hi=response.logq_lo)
        state = ChainState((0,), response)
        for u in rng.random(50):
            assert kernel.speculative_cut(state, n, float(u)) == kernel.cut(state, float(u))
            for received in range(1, n):
                partial = ChainState((0,), response.slice(0, received))
                cut = kernel.speculative_cut(partial, n, float(u))
                assert 0 <= cut < n
                if not kernel.state_dependent_cut:  # a law of the length: exact before the end
                    assert cut == kernel.cut(state, float(u))
