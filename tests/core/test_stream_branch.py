"""The ``stream`` traversal's accept-branch speculation: while the head streams, the proposals the
walk needs if the head accepts are issued from the head's prefix and its tokens received so far.

Replay of the sequential chain, token for token and decision for decision, for every sampler
over several blocks, with out-of-order completion, closes and broken streams, the accept branch
exercised (issued, and kept after accepts); exactness whatever the predictor says; and the
negative controls: an accept-branch proposal kept although its head rejected, and one issued
from a prefix past the head's tokens received, are caught by the replay check."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from presto_client.core import chain_runner
from presto_client.core.chain_runner import ChainSetup
from presto_client.core.kernels import make_kernel
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.rng import ChainRandomness
from presto_client.core.runners import run_chain
from presto_client.core.sampler_config import SamplerConfig
from presto_client.core.state import ChainState
from presto_client.core.stream import policy as stream_policy
from presto_client.core.stream import tuning
from presto_client.core.stream.flight import InFlight
from presto_client.core.stream.predictor import AcceptPredictor
from presto_client.core.stream.rule import StreamRuleError
from presto_client.core.stream.walk import StreamRunner
from tests.core.test_stream_overlap import (
    UnrulyEngine,
    _extension_seeds,
    _unchecked_take,
    _walk,
)

SAMPLERS = ("power_mh", "entropy_cut", "multi_try_mh")


def _floor(monkeypatch: pytest.MonkeyPatch, value: float) -> None:
    """Every runner made from here on gets the default tuning with this survival floor."""
    monkeypatch.setattr(
        tuning, "DEFAULT_TUNING", dataclasses.replace(tuning.DEFAULT_TUNING, survival_floor=value)
    )


@dataclasses.dataclass
class Outcome:
    same: bool
    issued: int = 0
    kept: int = 0
    breaks: int = 0
    cancelled: int = 0
    closed: int = 0
    accepts: int = 0


async def _replays(
    sampler: str,
    seeds: range,
    *,
    break_probability: float = 0.3,
    top_k: int | None = 4,
    overlap: bool = True,
    accept_branch: bool = True,
    window: int | None = None,
) -> Outcome:
    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(sampler=sampler, block_size=10, num_blocks=2, steps_per_block=16)
    out = Outcome(True)
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
        runner = StreamRunner(
            ChainSetup(engine, config, seed, size=window),
            overlap=overlap,
            accept_branch=accept_branch,
        )
        result = await runner.run([2])
        out.same = out.same and (
            result.full_token_ids == baseline.full_token_ids and _walk(result) == _walk(baseline)
        )
        assert engine.open_streams == 0  # every stream finished or was closed
        assert result.stats.transitions == 32 and result.stats.requests_used == 32
        out.issued += runner.branch_issued
        out.kept += runner.branch_kept
        out.breaks += engine.breaks
        out.cancelled += result.stats.requests_cancelled
        out.closed += engine.closed_early
        out.accepts += result.stats.accepts
    return out


@pytest.mark.parametrize("sampler", SAMPLERS)
async def test_the_accept_branch_replays_the_sequential_chain(sampler: str) -> None:
    """Accept-branch proposals issued while heads stream, two blocks, streams that complete out
    of order, close and break: the chain is the sequential chain, token for token and decision
    for decision."""
    out = await _replays(sampler, range(6))
    assert out.same
    assert out.issued > 0  # the scenario speculated accept branches
    assert out.breaks > 0 and out.cancelled > 0 and out.closed > 0
    if sampler != "entropy_cut":
        # Kept after the head accepted. (EntropyCut's branch cuts are guesses until the head is
        # complete; on these 10-token blocks they seldom hold, which the check catches.)
        assert out.kept > 0


@pytest.mark.parametrize("top_k", [None, 5], ids=["exact", "top5-certified"])
@pytest.mark.parametrize("sampler", SAMPLERS)
async def test_the_accept_branch_replays_with_a_cap_and_no_overlap(
    sampler: str, top_k: int | None
) -> None:
    out = await _replays(sampler, range(3), break_probability=0.0, top_k=top_k, window=12)
    assert out.same and out.issued > 0
    out = await _replays(sampler, range(3), break_probability=0.0, top_k=top_k, overlap=False)
    assert out.same and out.issued > 0


@pytest.mark.parametrize("sampler", SAMPLERS)
async def test_exactness_does_not_depend_on_the_predictor(
    sampler: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A predictor that always expects the accept (of any candidate) issues every branch it
    can, one that never does issues none: both chains are the sequential chain."""
    monkeypatch.setattr(AcceptPredictor, "predict", lambda self: (1.0, 1 % len(self._seen)))
    out = await _replays(sampler, range(4), break_probability=0.2)
    assert out.same and out.issued > 0
    monkeypatch.setattr(AcceptPredictor, "predict", lambda self: (0.0, 0))
    out = await _replays(sampler, range(4), break_probability=0.2)
    assert out.same and out.issued == 0


# ---- negative controls: the replay check catches the faults the accept branch could make


@pytest.mark.parametrize("sampler", ["power_mh", "multi_try_mh"])
async def test_replay_catches_an_accept_branch_kept_after_its_head_rejected(
    sampler: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A predictor that always expects the accept (of the first candidate), a cap, and a window
    that holds only proposals no earlier transition can rewrite (so the transitions past an
    earlier cut are the accept branch's): the chain is right with the check, and wrong when
    accept-branch proposals are kept whatever the head's decision (after a reject, or an accept
    of another candidate, their prefix holds tokens that are not the state's). With the default
    floor the window holds most such transitions itself and the fault seldom shows (24 chains
    once showed none)."""
    # The replay itself must catch it: the engine-health check (a normaliser gap between two
    # scorings of one context) would stop most such chains first.
    monkeypatch.setattr(chain_runner, "DRIFT_LIMIT", math.inf)
    monkeypatch.setattr(AcceptPredictor, "predict", lambda self: (1.0, 0))
    _floor(monkeypatch, 0.99)
    out = await _replays(sampler, range(6), break_probability=0.0, window=6)
    assert out.same and out.issued > 0 and out.kept > 0
    monkeypatch.setattr(StreamRunner, "_branch_usable", lambda self, flight, state: True)
    # The walk checks the rule again where it uses a proposal: it refuses to sample from one.
    with pytest.raises(StreamRuleError, match="transition"):
        await _replays(sampler, range(6), break_probability=0.0, window=6)
    # Without that second check too, the replay check catches it.
    monkeypatch.setattr(StreamRunner, "_take", _unchecked_take)
    out = await _replays(sampler, range(6), break_probability=0.0, window=6)
    assert out.issued > 0
    assert not out.same


def _prefix_only(self: StreamRunner, flight: InFlight, state: ChainState) -> bool:
    """A plausible check that compares only the tokens the proposal was issued after: right
    when they are the whole prefix, blind to a proposal issued before its prefix was in."""
    prefix = flight.response_prefix
    return bool(np.array_equal(state.response.token_ids[: len(prefix)], prefix))


async def test_replay_catches_an_accept_branch_issued_past_the_head_tokens_received(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the overlap (so only the accept branch is issued from a partial response) the
    weaker check alone is right; let the branch go out before its prefix is in, and the replay
    check catches it."""
    # The replay itself must catch it: the engine-health check (a normaliser gap between two
    # scorings of one context) would stop most such chains first.
    monkeypatch.setattr(chain_runner, "DRIFT_LIMIT", math.inf)
    monkeypatch.setattr(StreamRunner, "_usable", _prefix_only)
    out = await _replays("power_mh", range(6), break_probability=0.0, overlap=False)
    assert out.same and out.kept > 0
    # The walk's check and the policy's own filter both let a prefix not yet in go out.
    monkeypatch.setattr(StreamRunner, "_ready", lambda self, cut, received: True)
    monkeypatch.setattr(stream_policy, "ready", lambda cut, received: True)
    out = await _replays("power_mh", range(6), break_probability=0.0, overlap=False)
    assert not out.same
    out = await _replays(
        "power_mh", range(6), break_probability=0.0, overlap=False, accept_branch=False
    )
    assert out.same  # the fault is the accept branch's


# ---- the predictor


@pytest.mark.parametrize("sampler", ["power_mh", "multi_try_mh"])
async def test_the_predictor_agrees_with_the_kernel_once_the_proposal_is_complete(
    sampler: str,
) -> None:
    """With every token seen and exact scores nothing is left to estimate: the predicted accept
    is the kernel's decision (1 or 0), and MultiTryMH's candidate its selection."""
    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(sampler=sampler, block_size=12)
    kernel = make_kernel(config)
    engine = ReferenceEngine(model)
    randomness = ChainRandomness(0, k_try=kernel.sequences_per_proposal)
    (response,) = await engine.generate([kernel.extension_request((2,), 5)])
    state = ChainState((2,), response)
    agreed = accepted = 0
    for k in range(60):
        draws = randomness.transition(0, k)
        cut = kernel.cut(state, draws.u_cut)
        proposals = await engine.generate(
            kernel.requests(state.prefix(cut), state.length - cut, draws)
        )
        verdict = kernel.evaluate(state, cut, proposals, draws)
        predictor = AcceptPredictor(kernel, state, cut, draws)
        for i, proposal in enumerate(proposals):
            predictor.feed(i, proposal)
        probability, candidate = predictor.predict()
        assert probability in (0.0, 1.0)
        agreed += int((probability == 1.0) == verdict.accepted)
        if verdict.accepted:
            accepted += 1
            assert candidate == verdict.selected
            state = kernel.accept(state, cut, proposals, verdict)
    assert agreed == 60 and 0 < accepted < 60


async def test_the_predictor_is_unsure_early_and_sure_late() -> None:
    """Before any token the predicted accept lies strictly inside (0, 1); it moves towards the
    decision as tokens arrive."""
    model = ReferenceModel(10, seed=3)
    kernel = make_kernel(SamplerConfig(block_size=40))
    engine = ReferenceEngine(model)
    randomness = ChainRandomness(1)
    (response,) = await engine.generate([kernel.extension_request((2,), 5)])
    state = ChainState((2,), response)
    for k in range(10):
        draws = randomness.transition(0, k)
        cut = kernel.cut(state, draws.u_cut)
        (proposal,) = await engine.generate(
            kernel.requests(state.prefix(cut), state.length - cut, draws)
        )
        predictor = AcceptPredictor(kernel, state, cut, draws)
        early, _ = predictor.predict()
        if state.length - cut > 1:
            assert 0.0 < early < 1.0
        predictor.feed(0, proposal)
        late, _ = predictor.predict()
        assert not math.isnan(late) and late in (0.0, 1.0)


async def test_the_predictor_of_a_partial_state_extrapolates_the_current_suffix() -> None:
    """While the block's extension streams, the current suffix is known only in part: the
    prediction made from its first tokens (``length`` the whole) is unsure, and the one from
    the whole state is the full predictor's."""
    model = ReferenceModel(10, seed=3)
    kernel = make_kernel(SamplerConfig(block_size=40))
    engine = ReferenceEngine(model)
    randomness = ChainRandomness(2)
    (response,) = await engine.generate([kernel.extension_request((2,), 5)])
    state = ChainState((2,), response)
    for k in range(10):
        draws = randomness.transition(0, k)
        cut = min(kernel.cut(state, draws.u_cut), 30)
        (proposal,) = await engine.generate(
            kernel.requests(state.prefix(cut), state.length - cut, draws)
        )
        partial = ChainState((2,), response.slice(0, cut + 5))
        early = AcceptPredictor(kernel, partial, cut, draws, state.length)
        whole = AcceptPredictor(kernel, state, cut, draws, state.length)
        plain = AcceptPredictor(kernel, state, cut, draws)
        for predictor in (early, whole, plain):
            predictor.feed(0, proposal.slice(0, 5))
        assert 0.0 < early.predict()[0] < 1.0
        assert whole.predict() == plain.predict()


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_the_accept_branch_is_on_by_default_unless_the_cut_law_depends_on_the_state(
    sampler: str,
) -> None:
    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(sampler=sampler, block_size=10)
    runner = StreamRunner(ChainSetup(ReferenceEngine(model), config, 0))
    assert runner.accept_branch == (sampler != "entropy_cut")
    assert StreamRunner(
        ChainSetup(ReferenceEngine(model), config, 0), accept_branch=True
    ).accept_branch
