"""The ``stream`` traversal's speed policy alone, against a hand-made view of a walk (no engine,
no event loop), and the walk's check of what a policy proposes.

The policy only proposes: these tests read what it asks for. The negative controls give a real
walk a deliberately wrong policy (a wrong cut, a wrong state, a prefix not yet received) and
show the walk refuses it with an error naming the transition, before anything is sampled.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from presto_client.core.chain_runner import ChainSetup
from presto_client.core.engine_protocol import ScoredTokens
from presto_client.core.kernels import Kernel, make_kernel
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.rng import ChainRandomness, TransitionDraws
from presto_client.core.sampler_config import SamplerConfig
from presto_client.core.speculation import SpeculationBudget
from presto_client.core.state import ChainState
from presto_client.core.stream import rule, tuning
from presto_client.core.stream.flight import SPECULATIVE, InFlight
from presto_client.core.stream.policy import StreamPolicy
from presto_client.core.stream.rule import StreamRuleError
from presto_client.core.stream.tuning import StreamTuning
from presto_client.core.stream.view import Origin, Proposal
from presto_client.core.stream.walk import StreamRunner


class _Budget(SpeculationBudget):
    """Grants ``grants`` speculative proposals, then refuses."""

    def __init__(self, grants: int = 1 << 30) -> None:
        super().__init__(None, adaptive=False)
        self.grants = grants

    def try_acquire(self, sequences, reserved=0, used=None, own=None):  # type: ignore[no-untyped-def]
        if self.grants <= 0:
            return False
        self.grants -= 1
        return True


@dataclass
class _View:
    """A walk as the policy sees it, made by hand; it records what the policy asks."""

    kernel: Kernel
    steps: int
    cap: int | None = None
    budget: SpeculationBudget = field(default_factory=_Budget)
    accepts: int = 0
    transitions: int = 0
    window: dict[int, InFlight] = field(default_factory=dict)
    branches: Mapping[int, tuple[InFlight, Mapping[int, InFlight]]] = field(default_factory=dict)
    proposed: list[Proposal] = field(default_factory=list)
    refusals: list[tuple[int, bool]] = field(default_factory=list)
    randomness: ChainRandomness = field(default_factory=lambda: ChainRandomness(7))

    def draws(self, k: int) -> TransitionDraws:
        return self.randomness.transition(0, k)

    def ready(self, cut: int, received: int) -> bool:
        return cut <= received

    def usable(self, flight: InFlight, state: ChainState) -> bool:
        return rule.usable(self.kernel, flight, state)

    def propose(self, proposal: Proposal) -> InFlight:
        self.proposed.append(proposal)
        flight = _flight(self, proposal.k, proposal.cut, proposal.state)
        if proposal.origin is not Origin.BRANCH:
            self.window[proposal.k] = flight
        return flight

    def withdraw(self, base: int) -> None:
        raise AssertionError("no accept branch in these tests")

    def refused(self, k: int, first: bool) -> None:
        self.refusals.append((k, first))


def _flight(view: _View, k: int, cut: int, state: ChainState) -> InFlight:
    """A proposal in flight that has received nothing yet (no engine behind it)."""
    draws = view.draws(k)
    requests = view.kernel.requests(state.prefix(cut), state.length - cut, draws)
    flight = InFlight(
        k,
        requests,
        SPECULATIVE,
        draws=draws,
        cut=cut,
        response_prefix=state.response.token_ids[:cut].copy(),
    )
    flight.finished = [False] * len(requests)
    flight.chunks = [[] for _ in requests]
    return flight


def _state(n: int = 40) -> ChainState:
    tokens = [i % 10 for i in range(n)]
    return ChainState((1,), ScoredTokens.exact(tokens, [-1.0] * n, np.full((n, 1), -0.5)))


def _policy(view: _View, **tuned: float) -> StreamPolicy:
    chosen = dataclasses.replace(tuning.DEFAULT_TUNING, **tuned)
    return StreamPolicy(view, view, chosen, accept_branch=False)


def _head(view: _View, state: ChainState, m: int) -> None:
    """The walk's own proposal at ``m`` (the walk issues it, not the policy)."""
    view.window[m] = _flight(view, m, view.kernel.cut(state, view.draws(m).u_cut), state)


def test_the_policy_proposes_the_transitions_ahead_in_order_at_their_cuts() -> None:
    view = _View(make_kernel(SamplerConfig(block_size=40, steps_per_block=30)), steps=30)
    state = _state()
    _head(view, state, 3)
    _policy(view, survival_floor=0.0).refill(state, 3)
    assert [p.k for p in view.proposed] == list(range(4, 30))
    for p in view.proposed:
        assert p.state is state and p.origin is Origin.STATE
        assert p.cut == view.kernel.cut(state, view.draws(p.k).u_cut)
    assert not view.refusals


def test_the_cap_bounds_the_window() -> None:
    view = _View(make_kernel(SamplerConfig(block_size=40, steps_per_block=30)), steps=30, cap=5)
    state = _state()
    _head(view, state, 0)
    _policy(view, survival_floor=0.0).refill(state, 0)
    assert [p.k for p in view.proposed] == [1, 2, 3, 4]


def test_the_survival_floor_holds_back_proposals_an_earlier_accept_would_rewrite() -> None:
    view = _View(make_kernel(SamplerConfig(block_size=40, steps_per_block=30)), steps=30)
    state = _state()
    _head(view, state, 0)
    policy = _policy(view, survival_floor=0.5)
    policy.refill(state, 0)
    rate = policy.accept_rate()
    threats = [(view.window[0].cut, rate)]
    proposed = {p.k for p in view.proposed}
    for j in range(1, 30):
        cut = view.kernel.cut(state, view.draws(j).u_cut)
        assert (j in proposed) == (policy.survival(threats, cut) >= 0.5), j
        threats.append((cut, rate))
    assert 0 < len(proposed) < 29


def test_a_refusing_budget_stops_the_pass_and_is_reported_once() -> None:
    view = _View(
        make_kernel(SamplerConfig(block_size=40, steps_per_block=30)), steps=30, budget=_Budget(3)
    )
    state = _state()
    _head(view, state, 0)
    _policy(view, survival_floor=0.0).refill(state, 0)
    assert [p.k for p in view.proposed] == [1, 2, 3]  # never out of order
    assert view.refusals[0] == (4, True)
    assert all(not first for _, first in view.refusals[1:])
    assert [k for k, _ in view.refusals] == list(range(4, 30))


def test_while_the_extension_streams_only_cuts_inside_what_is_in_are_proposed() -> None:
    view = _View(make_kernel(SamplerConfig(block_size=40, steps_per_block=30)), steps=30)
    partial = ChainState((1,), _state().response.slice(0, 15))
    _policy(view, survival_floor=0.0).early(partial, 40)
    assert view.proposed
    for p in view.proposed:
        assert p.origin is Origin.EXTENSION and p.state is partial and p.cut <= 15
        assert p.cut == view.kernel.speculative_cut(partial, 40, view.draws(p.k).u_cut)


def test_the_next_block_is_speculated_only_near_the_end() -> None:
    view = _View(make_kernel(SamplerConfig(block_size=40, steps_per_block=30)), steps=30)
    policy = _policy(view)
    assert not policy.next_extension(20)  # 0.7^20: an accept would likely rewrite it
    assert policy.next_extension(1)


def test_known_rejections_threaten_nothing_and_known_accepts_everything() -> None:
    policy = StreamPolicy.survival
    assert policy([(5, 0.3), (30, 0.3), (30, 0.3)], 10) == pytest.approx(0.7)
    assert policy([(5, 0.0)] * 9, 10) == 1.0
    assert policy([(5, 0.0), (7, 1.0)], 10) == 0.0


# ---- the tuning object


def test_the_tuning_is_frozen_and_checked() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        tuning.DEFAULT_TUNING.survival_floor = 0.5  # type: ignore[misc]
    with pytest.raises(ValueError, match="survival_floor"):
        StreamTuning(survival_floor=1.5)
    with pytest.raises(ValueError, match="accept_prior"):
        StreamTuning(accept_prior=(5.0, 4.0))


def test_every_tuning_constant_says_why() -> None:
    """Each field of :class:`StreamTuning` is followed by its reason (a docstring)."""
    tree = ast.parse(inspect.getsource(StreamTuning))
    body = tree.body[0].body  # type: ignore[attr-defined]
    fields = [f.name for f in dataclasses.fields(StreamTuning)]
    documented = [
        node.target.id  # type: ignore[union-attr]
        for node, after in itertools.pairwise(body)
        if isinstance(node, ast.AnnAssign)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    ]
    assert documented == fields


# ---- negative controls: the walk refuses a wrong policy


class _WrongCut(StreamPolicy):
    """Proposes each transition ahead one token past the cut its uniform draws."""

    def refill(self, state: ChainState, m: int) -> None:
        if m + 1 < self.view.steps and m + 1 not in self.view.window:
            cut = self.view.kernel.cut(state, self.view.draws(m + 1).u_cut)
            self.sink.propose(Proposal(m + 1, (cut + 1) % state.length, state))


class _WrongState(StreamPolicy):
    """Proposes from a state whose tokens are not the walk's (a stale state, say)."""

    def refill(self, state: ChainState, m: int) -> None:
        if m + 1 < self.view.steps and m + 1 not in self.view.window:
            cut = self.view.kernel.cut(state, self.view.draws(m + 1).u_cut)
            tokens = state.response.token_ids.copy()
            tokens[: cut + 1] = (tokens[: cut + 1] + 1) % 10
            stale = state.with_response(dataclasses.replace(state.response, token_ids=tokens))
            self.sink.propose(Proposal(m + 1, cut, stale))


class _PastReceived(StreamPolicy):
    """While the extension streams, proposes at a cut past the tokens received."""

    def early(self, partial: ChainState, length: int) -> None:
        for j in range(self.view.steps):
            if j in self.view.window:
                continue
            cut = self.view.kernel.speculative_cut(partial, length, self.view.draws(j).u_cut)
            if cut > partial.length:
                self.sink.propose(Proposal(j, cut, partial, Origin.EXTENSION))
                return


@pytest.mark.parametrize(
    ("wrong", "says"),
    [(_WrongCut, "cut law draws"), (_WrongState, "another state"), (_PastReceived, "lies past")],
)
@pytest.mark.parametrize("sampler", ["power_mh", "entropy_cut", "multi_try_mh"])
async def test_the_walk_refuses_a_wrong_policy(
    sampler: str, wrong: type[StreamPolicy], says: str
) -> None:
    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(sampler=sampler, block_size=24, steps_per_block=12)
    runner = StreamRunner(ChainSetup(ReferenceEngine(model), config, 1, size=None))
    right = runner.policy
    runner.policy = wrong(right.view, right.sink, right.tuning, accept_branch=False)
    with pytest.raises(StreamRuleError, match=rf"transition \d+: .*{says}"):
        await runner.run([1])


def test_the_policy_cannot_reach_the_walk() -> None:
    """The speed policy's modules import neither the walk, its plumbing nor its rule: what
    they know of the walk is the read-only view, and what they can do is propose."""
    folder = Path(inspect.getfile(StreamPolicy)).parent
    walk_side = {"walk", "streams", "rule"}
    for name in ("policy", "predictor", "tuning", "view"):
        tree = ast.parse((folder / f"{name}.py").read_text(encoding="utf-8"))
        imported = {
            node.module.rpartition(".")[2]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
        }
        assert not imported & walk_side, (name, imported & walk_side)
