"""The ``stream`` traversal's speed policy alone, given hand-made snapshots of a walk (no engine,
no event loop), and the walk's check of what a policy proposes.

The policy only plans: these tests read what it wants, and that it cannot take a slot. The
negative controls give a real walk a deliberately wrong policy (a wrong cut, a wrong state, a
prefix not yet received) and show the walk refuses it with an error naming the transition,
before anything is sampled.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

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
from presto_client.core.stream import policy as policy_module
from presto_client.core.stream import predictor as predictor_module
from presto_client.core.stream import rule, tuning
from presto_client.core.stream.flight import SPECULATIVE, InFlight
from presto_client.core.stream.policy import StreamPolicy
from presto_client.core.stream.rule import StreamRuleError
from presto_client.core.stream.tuning import StreamTuning
from presto_client.core.stream.view import Origin, Plan, Proposal, WalkSnapshot
from presto_client.core.stream.walk import StreamRunner


@dataclass
class _Walk:
    """A walk's state made by hand: the policy is given its :meth:`snapshot` and answers with a
    plan; nothing here issues anything."""

    kernel: Kernel
    steps: int
    cap: int | None = None
    budget: SpeculationBudget = field(
        default_factory=lambda: SpeculationBudget(None, adaptive=False)
    )
    window: dict[int, InFlight] = field(default_factory=dict)
    randomness: ChainRandomness = field(default_factory=lambda: ChainRandomness(7))

    def draws(self, block: int, k: int) -> TransitionDraws:
        return self.randomness.transition(block, k)

    def snapshot(self) -> WalkSnapshot:
        return WalkSnapshot(
            self.kernel,
            self.steps,
            40,
            self.cap,
            0,
            0,
            MappingProxyType(self.window),
            MappingProxyType({}),
            MappingProxyType({}),
            0,
            self.draws,
            functools.partial(rule.usable, self.kernel),
            self.budget.marginal_cost,
        )


def _flight(walk: _Walk, k: int, cut: int, state: ChainState) -> InFlight:
    """A proposal in flight that has received nothing yet (no engine behind it)."""
    draws = walk.draws(0, k)
    requests = walk.kernel.requests(state.prefix(cut), state.length - cut, draws)
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


def _policy(**tuned: float) -> StreamPolicy:
    chosen = dataclasses.replace(tuning.DEFAULT_TUNING, **tuned)
    return StreamPolicy(chosen, accept_branch=False)


def _head(walk: _Walk, state: ChainState, m: int) -> None:
    """The walk's own proposal at ``m`` (the walk issues it, not the policy)."""
    walk.window[m] = _flight(walk, m, walk.kernel.cut(state, walk.draws(0, m).u_cut), state)


def _proposed(plan: Plan) -> list[Proposal]:
    assert all(isinstance(step, Proposal) for step in plan.steps)
    return [step for step in plan.steps if isinstance(step, Proposal)]


def _kernel() -> Kernel:
    return make_kernel(SamplerConfig(block_size=40, steps_per_block=30))


def test_the_policy_proposes_the_transitions_ahead_in_order_at_their_cuts() -> None:
    walk = _Walk(_kernel(), steps=30)
    state = _state()
    _head(walk, state, 3)
    plan = _policy(survival_floor=0.0).refill(walk.snapshot(), state, 3)
    proposed = _proposed(plan)
    assert [p.k for p in proposed] == list(range(4, 30))
    for p in proposed:
        assert p.state is state and p.origin is Origin.STATE
        assert p.cut == walk.kernel.cut(state, walk.draws(0, p.k).u_cut)
        assert p.survival is not None and 0.0 < p.survival <= 1.0  # why: how likely it is used
    assert plan.report_refusals  # a wait for one the budget refuses is counted as the budget's


def test_the_cap_bounds_the_window() -> None:
    walk = _Walk(_kernel(), steps=30, cap=5)
    state = _state()
    _head(walk, state, 0)
    plan = _policy(survival_floor=0.0).refill(walk.snapshot(), state, 0)
    assert [p.k for p in _proposed(plan)] == [1, 2, 3, 4]


def test_the_survival_floor_holds_back_proposals_an_earlier_accept_would_rewrite() -> None:
    walk = _Walk(_kernel(), steps=30)
    state = _state()
    _head(walk, state, 0)
    policy = _policy(survival_floor=0.5)
    snapshot = walk.snapshot()
    proposed = {p.k for p in _proposed(policy.refill(snapshot, state, 0))}
    rate = policy.accept_rate(snapshot)
    threats = [(walk.window[0].cut, rate)]
    for j in range(1, 30):
        cut = walk.kernel.cut(state, walk.draws(0, j).u_cut)
        assert (j in proposed) == (policy.survival(threats, cut) >= 0.5), j
        threats.append((cut, rate))
    assert 0 < len(proposed) < 29


def test_the_policy_reads_a_snapshot_and_cannot_take_a_slot() -> None:
    """Issue 49: every pass of the policy is given a snapshot and returns a plan. The snapshot
    holds no budget to take from and no walk to call (only the budget's marginal cost, a read),
    its mappings cannot be written, and after every pass the engine's budget holds exactly what
    it held before, however much the plan wants."""
    budget = SpeculationBudget(None, adaptive=False)
    walk = _Walk(_kernel(), steps=30, budget=budget)
    state = _state()
    _head(walk, state, 0)
    snapshot = walk.snapshot()
    reachable = {name for name in dir(snapshot) if not name.startswith("__")}
    assert not reachable & {"budget", "propose", "withdraw", "refused", "try_acquire"}
    assert not any(isinstance(getattr(snapshot, n), SpeculationBudget) for n in reachable)
    with pytest.raises(TypeError):
        snapshot.window[5] = walk.window[0]  # type: ignore[index]
    with pytest.raises(AttributeError):
        snapshot.cap = 3  # type: ignore[misc]
    before = (budget.speculative, budget.heads, budget.available)
    policy = _policy(survival_floor=0.0)
    partial = ChainState((1,), state.response.slice(0, 15))
    plans = [policy.refill(snapshot, state, 0), policy.early(walk.snapshot(), partial, 40)]
    for j in range(1, 30):  # the next block's proposals are wanted once this one's are out
        _head(walk, state, j)
    plans.append(policy.ahead(walk.snapshot(), state, 0))
    assert policy.next_extension(snapshot, 1)
    assert all(_proposed(plan) for plan in plans)
    assert (budget.speculative, budget.heads, budget.available) == before


def test_the_policy_module_names_no_budget_mutation() -> None:
    """The policy's source calls none of the budget's writers: taking and giving back slots is
    the walk's alone (a policy that grows such a call fails here)."""
    writers = {"try_acquire", "release", "add_head", "remove_head", "observe"}
    for module in (policy_module, predictor_module):
        tree = ast.parse(inspect.getsource(module))
        called = {
            node.func.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        }
        assert not called & writers, (module.__name__, called & writers)


async def test_the_walk_takes_the_slots_in_order_and_notes_the_rest_once() -> None:
    """A plan of 29 proposals against a budget with room for three: the walk issues the first
    three in transition order, never one out of order, and notes the rest as the budget's (one
    refusal counted for the pass)."""
    model = ReferenceModel(10, seed=3)
    config = SamplerConfig(block_size=40, steps_per_block=30)
    budget = SpeculationBudget(4, adaptive=False)
    runner = StreamRunner(ChainSetup(ReferenceEngine(model), config, 1, size=None, budget=budget))
    runner.policy = _policy(survival_floor=0.0)
    runner.policy.accept_branch = False
    runner._enter_block(0)
    runner._refill(_state(), 0)
    try:
        assert sorted(runner._window) == [0, 1, 2, 3]
        assert runner._refused == set(range(4, 30))
        assert runner.stats.budget_refusals == 1
        assert budget.speculative == 3 and budget.heads == 1
    finally:
        for flight in runner._window.values():
            runner._close(flight)
        await runner._drain()
    assert budget.speculative == 0 and budget.heads == 0


def test_while_the_extension_streams_only_cuts_inside_what_is_in_are_proposed() -> None:
    walk = _Walk(_kernel(), steps=30)
    partial = ChainState((1,), _state().response.slice(0, 15))
    proposed = _proposed(_policy(survival_floor=0.0).early(walk.snapshot(), partial, 40))
    assert proposed
    for p in proposed:
        assert p.origin is Origin.EXTENSION and p.state is partial and p.cut <= 15
        assert p.cut == walk.kernel.speculative_cut(partial, 40, walk.draws(0, p.k).u_cut)


def test_the_next_block_is_speculated_only_near_the_end() -> None:
    walk = _Walk(_kernel(), steps=30)
    policy = _policy()
    assert not policy.next_extension(walk.snapshot(), 20)  # 0.7^20: an accept likely rewrites it
    assert policy.next_extension(walk.snapshot(), 1)


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

    def refill(self, view: WalkSnapshot, state: ChainState, m: int) -> Plan:
        if m + 1 < view.steps and m + 1 not in view.window:
            cut = view.kernel.cut(state, view.draws(m + 1).u_cut)
            return Plan([Proposal(m + 1, (cut + 1) % state.length, state)])
        return Plan()


class _WrongState(StreamPolicy):
    """Proposes from a state whose tokens are not the walk's (a stale state, say)."""

    def refill(self, view: WalkSnapshot, state: ChainState, m: int) -> Plan:
        if m + 1 < view.steps and m + 1 not in view.window:
            cut = view.kernel.cut(state, view.draws(m + 1).u_cut)
            tokens = state.response.token_ids.copy()
            tokens[: cut + 1] = (tokens[: cut + 1] + 1) % 10
            stale = state.with_response(dataclasses.replace(state.response, token_ids=tokens))
            return Plan([Proposal(m + 1, cut, stale)])
        return Plan()


class _PastReceived(StreamPolicy):
    """While the extension streams, proposes at a cut past the tokens received."""

    def early(self, view: WalkSnapshot, partial: ChainState, length: int) -> Plan:
        for j in range(view.steps):
            if j in view.window:
                continue
            cut = view.kernel.speculative_cut(partial, length, view.draws(j).u_cut)
            if cut > partial.length:
                return Plan([Proposal(j, cut, partial, Origin.EXTENSION)])
        return Plan()


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
    runner.policy = wrong(runner.policy.tuning, accept_branch=False)
    with pytest.raises(StreamRuleError, match=rf"transition \d+: .*{says}"):
        await runner.run([1])


def test_the_policy_cannot_reach_the_walk() -> None:
    """The speed policy's modules import neither the walk, its plumbing nor its rule: what
    they know of the walk is the snapshot they are given, and what they can do is answer with
    a plan."""
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
